"""agentspec's session-aware client for vLLM servers.

```python
from agentspec.client import AgentSpecClient

with AgentSpecClient(backends=["http://gpu1:8000", "http://gpu2:8000"], model="m") as client:
    with client.session(group_id="task-17") as session:
        reply = session.chat([{"role": "user", "content": "hi"}], max_tokens=64)
        print(reply.content, session.stats().acceptance_rate)
```

See docs/client.md.
"""

from .client import AgentSpecClient, AsyncAgentSpecClient
from .config import ClientConfig, RetryPolicy
from .errors import (
    AgentSpecClientError,
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
from .health import BackendState
from .history import Seed, SeedKind, SeedScope
from .session import AsyncChatStream, AsyncSession, ChatStream, Session
from .types import ChatResult, SeedReceipt, SessionStats, TokenCompletion, Turn

__all__ = [
    "AgentSpecClient",
    "AgentSpecClientError",
    "AsyncAgentSpecClient",
    "AsyncChatStream",
    "AsyncSession",
    "BackendState",
    "BackendUnavailableError",
    "ChatResult",
    "ChatStream",
    "ClientClosedError",
    "ClientConfig",
    "InvalidIdError",
    "InvalidSeedError",
    "NoHealthyBackendError",
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
]
