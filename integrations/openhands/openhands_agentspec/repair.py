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
import threading
from collections import OrderedDict
from typing import Any

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

    def __init__(self, llm: LLM, conversation_id: str, *, timeout_s: float = 10.0) -> None:
        self.llm = llm
        self.conversation_id = str(conversation_id)
        self.failed_calls = 0
        self._poster = SeedPoster(timeout_s=timeout_s)
        # tool_call_id -> the call's text, for calls whose result has not come yet
        self._open: OrderedDict[str, str] = OrderedDict()
        # tool_call_ids of failed results that came before their call: OpenHands may run
        # tools in a pool, and a result can reach the callbacks first.
        self._early: OrderedDict[str, None] = OrderedDict()
        # Callbacks may come from OpenHands' threads.
        self._lock = threading.Lock()

    @property
    def seeded_tokens(self) -> int:
        """Tokens the server took from this hook's seeds so far."""
        return self._poster.delivered_tokens

    def __call__(self, event: Event) -> None:
        text = None
        with self._lock:
            if isinstance(event, ActionEvent):
                call = tool_call_text(event.tool_call)
                if event.tool_call_id in self._early:  # its failed result came first
                    del self._early[event.tool_call_id]
                    text = call
                else:
                    _bounded_put(self._open, event.tool_call_id, call)
            elif isinstance(event, ObservationEvent | AgentErrorEvent) and failed(event):
                text = self._open.pop(event.tool_call_id, None)
                if text is None:
                    _bounded_put(self._early, event.tool_call_id, None)
            elif isinstance(event, ObservationEvent | AgentErrorEvent):
                self._open.pop(event.tool_call_id, None)
            if text is not None:
                self.failed_calls += 1
        if text is not None:
            seed = Seed.of(text, kind="repair_attempt")
            self._poster.send(self.llm, self.conversation_id, [seed], group_id=group_of(self.llm))


def _bounded_put(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    while len(table) > MAX_OPEN_CALLS:
        table.popitem(last=False)
