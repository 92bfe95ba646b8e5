"""agentspec as a replay proposer: the server's own :class:`~agentspec.driver.RequestDriver`.

The replay drives the same driver over the same :class:`~agentspec.index.DraftIndex` as the
vLLM proposer, so what the benchmark prints is what the server's drafting logic delivers.
The index sees only the prompt it is given, so under ``--window`` it keeps what the
condenser dropped only if its session level retained it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from agentspec.draft_budget.batch_budget import BatchBudget
from agentspec.draft_budget.cost_budget import CostBudget
from agentspec.draft_budget.speed_budget import CUT_PROBS
from agentspec.driver import RequestDriver, RequestSpec, TokenSeed
from agentspec.replay.calls import CallSpec
from agentspec.replay.proposer import (
    EMPTY_DRAFT,
    Proposer,
    ProposerSettings,
    ReplayDraft,
)

if TYPE_CHECKING:
    from agentspec.index import DraftIndex


class DriverProposer:
    """One replica's agentspec drafting, through the engine's request driver.

    Replayed calls carry seeds only under condenser seeding (what the window dropped), and
    no stop tokens of their own (the recorded output ends where it ended). One call at a
    time, the batch budget never cuts a draft; under lockstep (:meth:`set_batch_size`)
    drafts get the caps of ``agentspec serve``'s fixed batch rule
    (:class:`~agentspec.draft_budget.batch_budget.BatchBudget` with ``k`` the policy's ``max_spec_tokens``).
    With ``cost`` (a server's measured step cost, ``agentspec bench --cost-profile``), each
    step's drafts are cut where that server's cost budget would cut them, at the batch of
    the step (one request, or the lockstep batch).
    """

    #: The probability cuts whose outcomes the replay counts (agentspec.draft_budget.speed_budget).
    cut_probs: tuple[float, ...] = CUT_PROBS

    def __init__(self, index: DraftIndex, cost: CostBudget | None = None) -> None:
        self.driver = RequestDriver(index, cost)
        self._cost = cost
        self._shared: list[np.ndarray] | None = None  # None: not sharing
        self._budget: BatchBudget | None = None  # made when first told a batch size
        self._cap: int | None = None  # None: the policy's longest draft
        self._batch = 1

    @property
    def index(self) -> DraftIndex:
        return self.driver.index

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        spec = RequestSpec(session_id=call.session_id, group_id=call.group_id, seeds=tuple(seeds))
        self.driver.admit(call.call_id, spec)
        self.driver.begin(call.call_id, prompt)

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        self.driver.advance(call_id, tokens)

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        # The index holds the call's context itself; ``context`` is not needed.
        if self._cost is not None:
            # The server's cost budget prices the step (and sets its cut) before drafting.
            k = self.index.config.policy.max_spec_tokens
            self.driver.budget_for(self._batch, k if self._cap is None else self._cap)
        d = self.driver.draft(call_id, self._cap)
        return ReplayDraft(d.token_ids, probs=d.probs) if d is not None and d.token_ids else EMPTY_DRAFT

    def verified(self, call_id: str, drafted: int, accepted: int) -> None:
        self.driver.verified(call_id, accepted)
        if self._cost is not None:
            # What one request verified and emitted in its step; no clock of the server's.
            self._cost.observe_timed_step(1, 1 + drafted, 1 + accepted, None)

    def end_call(self, call_id: str) -> None:
        out = self.driver.release(call_id, share=self._shared is not None)
        if self._shared is not None and out is not None and len(out):
            self._shared.append(out)

    def set_batch_size(self, requests: int) -> None:
        self._batch = max(1, requests)
        if self._cost is not None:
            return  # the cost budget prices the batch in propose
        if self._budget is None:
            self._budget = BatchBudget(self.index.config.policy.max_spec_tokens)
        self._cap = self._budget.tokens_for(requests)

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

    def held_tokens(self) -> int:
        stats = self.index.stats()
        return stats.session_tokens + stats.group_tokens + stats.global_tokens


def make_agentspec_index(settings: ProposerSettings) -> DraftIndex:
    """A DraftIndex with the given draft policy (the index's defaults when None)."""
    from agentspec.index import DraftIndex
    from agentspec.index.policy import DraftPolicy, IndexConfig

    return DraftIndex(IndexConfig(policy=settings.agentspec_policy or DraftPolicy()))


def make_agentspec(settings: ProposerSettings) -> Proposer:
    index = make_agentspec_index(settings)
    if settings.cost_profile is None:
        return DriverProposer(index)
    # The server's cost budget at the server's measured cost; the replay's clock is not the server's.
    return DriverProposer(index, CostBudget(index.config.policy.max_spec_tokens, settings.cost_profile, learns=False))
