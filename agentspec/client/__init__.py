"""agentspec's session-aware client for vLLM servers.

```python
from agentspec.client import AgentSpecClient

with AgentSpecClient(backends=["http://gpu1:8000", "http://gpu2:8000"], model="m") as client:
    with client.session(group_id="task-17") as session:
        reply = session.chat([{"role": "user", "content": "hi"}], max_tokens=64)
        print(reply.content, session.stats().acceptance_rate)
```

Clients built on httpx (the OpenAI SDK, LangChain's ``ChatOpenAI``) pin sessions and fail
over by taking an ``httpx.Client(transport=FailoverTransport(...))``
(:mod:`agentspec.client.transport`). Integrations that make their own HTTP calls route them
with :class:`BackendRouter` (pins, health, and the retry machine of
:mod:`agentspec.client.attempts`) and write their requests with
:mod:`agentspec.client.protocol` (the ids and seeds a request carries, the session-stats
request, and the one mapping of HTTP answers to these errors). See docs/client.md.
"""

from . import protocol
from .attempts import (
    Attempt,
    CallAttempts,
    Failure,
    FailureKind,
    Probe,
    Received,
    Wait,
    classify_error,
    describe,
    parse_retry_after,
)
from .client import AgentSpecClient, AsyncAgentSpecClient
from .config import ClientConfig, RetryPolicy, normalise_backend
from .errors import (
    AgentSpecClientError,
    AuthenticationError,
    BackendUnavailableError,
    ClientClosedError,
    InvalidIdError,
    InvalidSeedError,
    NoHealthyBackendError,
    ServerRefusedError,
    SessionClosedError,
    SessionNotFoundError,
    StreamInterruptedError,
)
from .history import Seed, SeedKind, SeedScope
from .router import BackendRouter, BackendState, classify_http_error
from .session import AsyncChatStream, AsyncSession, ChatStream, Session
from .transport import AsyncFailoverTransport, Failover, FailoverTransport, failover_policy
from .types import ChatResult, SeedReceipt, SessionStats, TokenCompletion, Turn

__all__ = [
    "AgentSpecClient",
    "AgentSpecClientError",
    "AsyncAgentSpecClient",
    "AsyncChatStream",
    "AsyncFailoverTransport",
    "AsyncSession",
    "Attempt",
    "AuthenticationError",
    "BackendRouter",
    "BackendState",
    "BackendUnavailableError",
    "CallAttempts",
    "ChatResult",
    "ChatStream",
    "ClientClosedError",
    "ClientConfig",
    "Failover",
    "FailoverTransport",
    "Failure",
    "FailureKind",
    "InvalidIdError",
    "InvalidSeedError",
    "NoHealthyBackendError",
    "Probe",
    "Received",
    "RetryPolicy",
    "Seed",
    "SeedKind",
    "SeedReceipt",
    "SeedScope",
    "ServerRefusedError",
    "Session",
    "SessionClosedError",
    "SessionNotFoundError",
    "SessionStats",
    "StreamInterruptedError",
    "TokenCompletion",
    "Turn",
    "Wait",
    "classify_error",
    "classify_http_error",
    "describe",
    "failover_policy",
    "normalise_backend",
    "parse_retry_after",
    "protocol",
]
