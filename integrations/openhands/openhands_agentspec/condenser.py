"""A condenser wrapper: what an OpenHands condenser drops from the prompt is seeded.

When a condenser forgets events (a summarising condenser replaces the middle of the
history with a summary), the text of those events leaves the prompt, and a server that
did not see the earlier calls (after a failover, a restart, or an eviction) no longer has
it to draft from. :class:`SeedingCondenser` wraps any condenser; each time it condenses,
the forgotten events' text is sent to the conversation's session as ``prior_turn`` seeds,
before the agent's next call.

The conversation is the one OpenHands is running (its LLM call context, which OpenHands
sets for condensers); the server and credentials are the agent's LLM's.
"""

from __future__ import annotations

import logging

from openhands.sdk.context.condenser.base import CondenserBase
from openhands.sdk.context.view import View
from openhands.sdk.event.condenser import Condensation
from openhands.sdk.llm import LLM
from openhands.sdk.llm.call_context import resolve_llm_call_context
from pydantic import Field, PrivateAttr

from agentspec.client import Seed
from openhands_agentspec._endpoint import SeedPoster
from openhands_agentspec._text import event_text
from openhands_agentspec.llm import group_of

__all__ = ["SeedingCondenser", "forgotten_text"]

logger = logging.getLogger(__name__)


def forgotten_text(view: View, condensation: Condensation) -> list[str]:
    """The text of each event ``condensation`` forgets, in history order (empty ones left out)."""
    forgotten = condensation.forgotten_event_ids
    texts = (event_text(event) for event in view.events if event.id in forgotten)
    return [text for text in texts if text]


class SeedingCondenser(CondenserBase):
    """Wraps ``condenser``; seeds what it forgets into the conversation's agentspec session."""

    condenser: CondenserBase = Field(description="The condenser that decides what is forgotten.")
    timeout_s: float = Field(default=10.0, gt=0, description="Timeout of one seed request.")

    _poster: SeedPoster = PrivateAttr(default_factory=SeedPoster)

    @property
    def seeded_tokens(self) -> int:
        """Tokens the server took from this condenser's seeds so far."""
        return self._poster.delivered_tokens

    def get_llm(self) -> LLM | None:
        return self.condenser.get_llm()

    def handles_condensation_requests(self) -> bool:
        return self.condenser.handles_condensation_requests()

    def condense(self, view: View, agent_llm: LLM | None = None) -> View | Condensation:
        result = self.condenser.condense(view, agent_llm=agent_llm)
        if isinstance(result, Condensation):
            self._seed(view, result, agent_llm)
        return result

    async def acondense(self, view: View, agent_llm: LLM | None = None) -> View | Condensation:
        result = await self.condenser.acondense(view, agent_llm=agent_llm)
        if isinstance(result, Condensation):
            # One short request; OpenHands' own sync path blocks the same way.
            self._seed(view, result, agent_llm)
        return result

    def _seed(self, view: View, condensation: Condensation, agent_llm: LLM | None) -> None:
        llm = agent_llm or self.condenser.get_llm()
        session_id = resolve_llm_call_context(None).session_id
        texts = forgotten_text(view, condensation)
        if llm is None or session_id is None or not texts:
            logger.debug(
                "agentspec: condensation not seeded (llm=%s, session=%s)",
                llm is not None,
                session_id,
            )
            return
        self._poster.timeout_s = self.timeout_s
        seeds = [Seed.of(text, kind="prior_turn") for text in texts]
        self._poster.send(llm, session_id, seeds, group_id=group_of(llm))
