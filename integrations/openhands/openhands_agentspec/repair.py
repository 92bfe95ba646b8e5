"""The repair hook: a tool call that failed is seeded as a repair attempt.

When a command exits non-zero or an edit is refused, agents usually try again with a
corrected version of the same call: most of the failed call's text comes back. A
:class:`RepairSeeder` is an OpenHands conversation callback (``Conversation(callbacks=
[...])``, a public extension point) that watches tool calls and their results; when a
result is an error, the failed call is sent to the conversation's session as a
``repair_attempt`` seed before the agent's next call.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from openhands.sdk import LLM
from openhands.sdk.event import ActionEvent, AgentErrorEvent, Event, ObservationEvent

from agentspec.client import Seed
from openhands_agentspec._endpoint import SeedPoster
from openhands_agentspec._text import tool_call_text
from openhands_agentspec.llm import group_of

__all__ = ["RepairSeeder", "failed"]

logger = logging.getLogger(__name__)

#: Tool calls remembered while waiting for their results.
MAX_OPEN_CALLS = 256
#: Exit codes that say nothing about success: None (no command ran), -1 (still running,
#: timed out or interrupted; OpenHands reports those as such).
_UNKNOWN_EXIT = (None, -1)


def failed(event: ObservationEvent | AgentErrorEvent) -> bool:
    """Whether a tool result reports a failure: an error result, or a non-zero exit code."""
    if isinstance(event, AgentErrorEvent):
        return True
    observation = event.observation
    if observation.is_error:
        return True
    exit_code = getattr(observation, "exit_code", None)
    return exit_code not in _UNKNOWN_EXIT and exit_code != 0


class RepairSeeder:
    """Conversation callback that seeds failed tool calls as repair attempts.

    Args:
        llm: the agent's LLM (its server, credentials and group are used for the seeds).
        conversation_id: the conversation's id, which is its agentspec session.
    """

    def __init__(
        self, llm: LLM, conversation_id: str, *, timeout_s: float = 10.0
    ) -> None:
        self.llm = llm
        self.conversation_id = str(conversation_id)
        self.failed_calls = 0
        self._poster = SeedPoster(timeout_s=timeout_s)
        self._open: OrderedDict[str, str] = (
            OrderedDict()
        )  # tool_call_id -> the call's text

    @property
    def seeded_tokens(self) -> int:
        """Tokens the server took from this hook's seeds so far."""
        return self._poster.delivered_tokens

    def __call__(self, event: Event) -> None:
        if isinstance(event, ActionEvent):
            self._open[event.tool_call_id] = tool_call_text(event.tool_call)
            while len(self._open) > MAX_OPEN_CALLS:
                self._open.popitem(last=False)
        elif isinstance(event, ObservationEvent | AgentErrorEvent):
            call = self._open.pop(event.tool_call_id, None)
            if call is not None and failed(event):
                self.failed_calls += 1
                seed = Seed.of(call, kind="repair_attempt")
                self._poster.send(
                    self.llm, self.conversation_id, [seed], group_id=group_of(self.llm)
                )
