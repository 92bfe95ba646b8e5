"""The agentspec draft index as a replay proposer.

The same :class:`agentspec.index.DraftIndex` the vLLM plugin runs, driven the same
way: ``start_call`` with the call's session and group, ``extend_call`` with every
step's emitted tokens, ``propose``, ``record_verification`` and ``finish_call``.
The index sees only the prompt it is given, so under ``--window`` it keeps what
the condenser dropped only if its session level retained it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from agentspec.replay.calls import CallSpec
from agentspec.replay.proposer import EMPTY_DRAFT, Draft, Proposer, ProposerSettings

if TYPE_CHECKING:
    from agentspec.index import DraftIndex


class AgentspecProposer:
    def __init__(self, index: DraftIndex) -> None:
        self.index = index
        self._shared: list[np.ndarray] | None = None  # None: not sharing

    def begin_call(self, call: CallSpec, prompt: np.ndarray) -> None:
        self.index.start_call(call.call_id, prompt, session_id=call.session_id, group_id=call.group_id)

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        self.index.extend_call(call_id, tokens)

    def propose(self, call_id: str, context: np.ndarray) -> Draft:
        # The index holds the call's context itself; ``context`` is not needed.
        d = self.index.propose(call_id)
        return Draft(d.token_ids) if d.token_ids else EMPTY_DRAFT

    def verified(self, call_id: str, drafted: int, accepted: int) -> None:
        if drafted:
            self.index.record_verification(call_id, drafted=drafted, accepted=accepted)

    def end_call(self, call_id: str) -> None:
        if self._shared is not None:
            out = self.index.shared_output(call_id)
            if out is not None and len(out):
                self._shared.append(out)
        self.index.finish_call(call_id)

    def start_sharing(self) -> None:
        if self._shared is None:
            self._shared = []

    def take_shared_outputs(self) -> list[np.ndarray]:
        if self._shared is None:
            return []
        taken, self._shared = self._shared, []
        return taken

    def add_peer_outputs(self, outputs: Sequence[np.ndarray]) -> None:
        for out in outputs:
            self.index.add_peer_output(out)

    def memory_bytes(self) -> int:
        return self.index.stats().memory_bytes


def make_agentspec_index(settings: ProposerSettings) -> DraftIndex:
    """A DraftIndex with the given draft policy (the index's defaults when None)."""
    from agentspec.index import DraftIndex
    from agentspec.policy import DraftPolicy, IndexConfig

    return DraftIndex(IndexConfig(policy=settings.agentspec_policy or DraftPolicy()))


def make_agentspec(settings: ProposerSettings) -> Proposer:
    return AgentspecProposer(make_agentspec_index(settings))
