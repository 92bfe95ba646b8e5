"""One task, several attempts: the pieces of the integration put together.

```python
task = AgentspecTask("http://router:30000", "qwen-coder", task_id="django__django-11099")
llm = task.llm(max_output_tokens=2048)
summarizer = LLMSummarizingCondenser(llm=llm.model_copy(update={"usage_id": "condenser"}))
agent = Agent(llm=llm, tools=[...], condenser=task.condenser(summarizer))
attempt = task.attempt()
conversation = Conversation(agent=agent, workspace=repo, conversation_id=attempt.conversation_id,
                            callbacks=attempt.callbacks)
conversation.send_message(problem_statement)
conversation.run()
print(attempt.stats().acceptance_rate)
```

Every attempt is a new conversation (its own agentspec session) in the task's group, so
later attempts draft from earlier ones and a router keeps them on one server.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openhands.sdk import LLM
from openhands.sdk.context.condenser.base import CondenserBase
from openhands.sdk.event import Event
from pydantic import SecretStr

from agentspec.client import Seed, SessionStats
from openhands_agentspec._endpoint import SeedPoster, fetch_stats
from openhands_agentspec.condenser import SeedingCondenser
from openhands_agentspec.llm import agentspec_llm, group_of
from openhands_agentspec.repair import RepairSeeder

__all__ = ["AgentspecTask", "TaskAttempt", "conversation_stats"]


def conversation_stats(llm: LLM, conversation_id: str | uuid.UUID, *, timeout_s: float = 10.0) -> SessionStats:
    """The server's draft statistics of one OpenHands conversation (its agentspec session).

    ``llm`` is the conversation's agent LLM: behind a router its group header takes the
    request to the server that holds the session.
    """
    return fetch_stats(llm, str(conversation_id), timeout_s=timeout_s)


@dataclass
class TaskAttempt:
    """One conversation at a task: its id, the callbacks to give ``Conversation``, its stats."""

    conversation_id: uuid.UUID
    llm: LLM
    repair: RepairSeeder
    callbacks: list[Callable[[Event], None]] = field(default_factory=list)
    poster: SeedPoster = field(default_factory=SeedPoster)
    """Delivers :meth:`seed`'s seeds (and keeps those the server could not take yet)."""

    def stats(self) -> SessionStats:
        return conversation_stats(self.llm, self.conversation_id)

    def seed(self, text: str, *, kind: str = "repair_attempt", scope: str = "group") -> int:
        """Seed ``text`` now (for instance an earlier attempt's failed patch, into the task's
        group, before this attempt starts); the tokens the server took (0: kept for later)."""
        seed = Seed.of(text, kind=kind, scope=scope)
        return self.poster.send(self.llm, str(self.conversation_id), [seed], group_id=group_of(self.llm))


class AgentspecTask:
    """Builds pinned LLMs, seeding condensers and attempts for one task (one group)."""

    def __init__(
        self,
        base_url: str,
        served_model: str,
        task_id: str,
        *,
        api_key: str | SecretStr | None = None,
        temperature: float | None = None,
        extra_body: dict[str, Any] | None = None,
        **llm_fields: Any,
    ) -> None:
        self.task_id = task_id
        self._llm = agentspec_llm(
            base_url,
            served_model,
            group_id=task_id,
            api_key=api_key,
            temperature=temperature,
            extra_body=extra_body,
            **llm_fields,
        )
        self.attempts: list[TaskAttempt] = []

    def llm(self, **updates: Any) -> LLM:
        """The task's LLM (a copy; ``updates`` change fields, e.g. ``usage_id="condenser"``)."""
        return self._llm.model_copy(update=updates)

    def condenser(self, inner: CondenserBase) -> SeedingCondenser:
        """``inner``, seeding what it forgets into the running conversation's session."""
        return SeedingCondenser(condenser=inner)

    def attempt(self) -> TaskAttempt:
        """A new conversation at the task: pass ``conversation_id`` and ``callbacks`` to
        ``Conversation``."""
        conversation_id = uuid.uuid4()
        repair = RepairSeeder(self._llm, str(conversation_id))
        attempt = TaskAttempt(conversation_id, self._llm, repair, [repair])
        self.attempts.append(attempt)
        return attempt
