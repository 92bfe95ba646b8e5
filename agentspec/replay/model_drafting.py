"""A model drafter in the replay: alone (vLLM's ``eagle3`` method), and beside the index as
``agentspec serve --agentspec-drafter`` runs it (the hybrid).

The model drafter is anything with :class:`ModelDrafter`'s two methods; ``agentspec bench
--drafter HEAD --target MODEL`` gives a trained EAGLE-3 head
(:class:`agentspec.head.drafter.HeadDrafter`, which runs the target model to read
its hidden states). It drafts a whole call's steps at once from the recorded text, in one
forward pass instead of one per step: each step's draft is what drafting at that step gives
up to and including its first token that differs from the recorded output, which is all
greedy verification reads (``tests/training/test_head_drafter.py`` checks this against
drafting step by step). Drafts are keyed by session, so a drafter may keep its caches
across a session's calls as a server's prefix cache does.

The hybrid makes each step's choice through the server's own rule
(:class:`~agentspec.draft_budget.drafter_choice.HybridRule`): the index's draft, computed
first, against a model draft of the drafter's length, with the model drafter's acceptance
estimated online from the outcomes of the model drafts sent so far. The server's drafter
runs its first pass every step (its KV cache) and its later passes only on steps where
some request chose it; here the drafter is asked only on those steps and catches up on
what it has not read, which gives the same drafts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np

from agentspec.draft_budget.drafter_choice import DraftPath, HybridRule
from agentspec.replay.calls import CallSpec
from agentspec.replay.driver_proposer import DriverProposer
from agentspec.replay.proposer import EMPTY_DRAFT, ReplayDraft
from agentspec.replay.settings import DrafterReplaySettings, ProposerSettings

if TYPE_CHECKING:
    from agentspec.driver import TokenSeed
    from agentspec.index import DraftIndex

__all__ = [
    "HYBRID_COUNTERS",
    "DrafterProposer",
    "HybridProposer",
    "ModelDrafter",
    "make_drafter_alone",
    "make_hybrid",
    "make_hybrid_arctic",
]

#: A step counts as the index's hard case (what the drafter is for) when the index expected
#: fewer accepted tokens than this (docs/engine.md, the addressable share).
HARD_BELOW = 2.0

#: The hybrid's counters (:meth:`HybridProposer.counters`), summed over a replay's servers.
HYBRID_COUNTERS = (
    "suffix_drafts",
    "suffix_accepted_tokens",
    "model_drafts",
    "model_draft_tokens",
    "model_accepted_tokens",
    "drafter_runs",
    "drafter_runs_skipped",
    "hard_steps",
    "hard_step_tokens",
    "hard_step_model_accepted_tokens",
)


@runtime_checkable
class ModelDrafter(Protocol):
    """A model that drafts the next tokens of a context, for all steps of a call at once."""

    def call_chains(self, stream: str, prompt: Sequence[int], output: Sequence[int], tokens: int) -> list[list[int]]:
        """Row ``i``: up to ``tokens`` draft tokens to follow ``prompt + output[:i + 1]``,
        which may differ from drafting at that step only past their first token that
        differs from ``output``; empty when the call is beyond the drafter. ``stream`` names
        the session, whose earlier calls the drafter may have cached."""
        ...

    def forget(self, stream: str) -> None:
        """The stream will not be asked again (its caches may go)."""
        ...


class _CallChains:
    """Each call's model drafts by step, from :meth:`ModelDrafter.call_chains`."""

    def __init__(self, drafter: ModelDrafter, tokens: int) -> None:
        if tokens < 1:
            raise ValueError("the drafter drafts at least 1 token per step")
        self.drafter = drafter
        self.tokens = tokens
        self._calls: dict[str, tuple[str, np.ndarray]] = {}  # call -> (session, prompt)
        self._chains: dict[str, tuple[int, list[list[int]]]] = {}  # call -> (prompt length, rows)

    def begin(self, call: CallSpec, prompt: np.ndarray) -> None:
        self._calls[call.call_id] = (call.session_id, prompt)

    def take_output(self, call_id: str, output: np.ndarray) -> None:
        session, prompt = self._calls[call_id]
        rows = self.drafter.call_chains(session, prompt.tolist(), output.tolist(), self.tokens)
        self._chains[call_id] = (len(prompt), rows)

    def draft(self, call_id: str, context_len: int, tokens: int) -> list[int]:
        prompt_len, rows = self._chains.get(call_id, (0, []))
        row = context_len - prompt_len - 1
        return rows[row][:tokens] if 0 <= row < len(rows) else []

    def end(self, call_id: str) -> None:
        self._calls.pop(call_id, None)
        self._chains.pop(call_id, None)


class DrafterProposer:
    """The model drafter alone, drafting ``tokens`` tokens at every step (vLLM's EAGLE-3
    method with the same head)."""

    def __init__(self, drafter: ModelDrafter, tokens: int) -> None:
        self._model = _CallChains(drafter, tokens)
        self.tokens = tokens

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        self._model.begin(call, prompt)

    def take_output(self, call_id: str, output: np.ndarray) -> None:
        self._model.take_output(call_id, output)

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        pass

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        tokens = self._model.draft(call_id, len(context), self.tokens)
        return ReplayDraft(tokens) if tokens else EMPTY_DRAFT

    def verified(self, call_id: str, drafted: int, accepted: int) -> None:
        pass

    def end_call(self, call_id: str) -> None:
        self._model.end(call_id)

    def memory_bytes(self) -> int:
        return 0

    def held_tokens(self) -> int:
        return 0


class HybridProposer(DriverProposer):
    """agentspec's index with a model drafter beside it, one request's choice per step."""

    def __init__(self, index: DraftIndex, drafter: ModelDrafter, tokens: int, rule: HybridRule) -> None:
        super().__init__(index)
        self._model = _CallChains(drafter, tokens)
        self.tokens = tokens
        self.rule = rule
        # Per request: the path of the draft sent last, and whether its step was a hard one.
        self._sent: dict[str, tuple[DraftPath, bool]] = {}
        self._counts = dict.fromkeys(HYBRID_COUNTERS, 0)

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        super().begin_call(call, prompt, seeds)
        self._model.begin(call, prompt)

    def take_output(self, call_id: str, output: np.ndarray) -> None:
        self._model.take_output(call_id, output)

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        driver = self.driver
        draft = driver.draft(call_id, self._cap)
        index_len = len(draft.token_ids) if draft is not None else 0
        expected = score = 0.0
        if draft is not None and index_len:
            spec = driver.spec(call_id)
            expected = self.index.expected_accepted(draft, spec.tenant if spec is not None else "")
            score = draft.score
        model_cap = min(self.tokens, self._cap) if self._cap is not None else self.tokens
        model_len = model_cap if driver.may_draft(call_id) else 0
        path = self.rule.choose(index_len, score, expected, model_len, self.rule.model_expected(model_cap))
        hard = expected < HARD_BELOW
        if path is not DraftPath.SUFFIX and index_len:
            driver.withdraw(call_id)
        if path is DraftPath.MODEL:
            self._counts["drafter_runs"] += 1
            tokens = self._model.draft(call_id, len(context), model_len)
            if tokens:
                self._sent[call_id] = (DraftPath.MODEL, hard)
                return ReplayDraft(tokens)
            path = DraftPath.NONE
        else:
            self._counts["drafter_runs_skipped"] += 1
        if path is DraftPath.SUFFIX and draft is not None:
            self._sent[call_id] = (DraftPath.SUFFIX, hard)
            return ReplayDraft(draft.token_ids, probs=draft.probs)
        self._sent[call_id] = (DraftPath.NONE, hard)
        return EMPTY_DRAFT

    def verified(self, call_id: str, drafted: int, accepted: int) -> None:
        path, hard = self._sent.pop(call_id, (DraftPath.NONE, False))
        c = self._counts
        if hard:
            c["hard_steps"] += 1
            c["hard_step_tokens"] += accepted + 1
        if path is DraftPath.MODEL:
            c["model_drafts"] += 1
            c["model_draft_tokens"] += drafted
            c["model_accepted_tokens"] += accepted
            if hard:
                c["hard_step_model_accepted_tokens"] += accepted
            self.rule.observe_model(drafted, accepted)
            if self.index.has_call(call_id):
                self.index.record_model_verification(call_id, drafted, accepted)
            return
        if path is DraftPath.SUFFIX:
            c["suffix_drafts"] += 1
            c["suffix_accepted_tokens"] += accepted
        super().verified(call_id, drafted, accepted)

    def end_call(self, call_id: str) -> None:
        self._model.end(call_id)
        self._sent.pop(call_id, None)
        super().end_call(call_id)

    def counters(self) -> Mapping[str, int]:
        """What the hybrid chose and what it got, as the server's metrics count it."""
        return dict(self._counts)


def _drafter(settings: DrafterReplaySettings) -> ModelDrafter:
    from agentspec.head.drafter import HeadDrafter

    return HeadDrafter.load(settings.head, settings.target, device=settings.device)


def _need(settings: ProposerSettings) -> DrafterReplaySettings:
    if settings.drafter is None:
        raise ValueError("this proposer drafts with a trained head: give agentspec bench --drafter HEAD --target MODEL")
    return settings.drafter


def make_drafter_alone(settings: ProposerSettings) -> DrafterProposer:
    """The ``drafter`` proposer: the head alone, as vLLM's eagle3 method runs it."""
    drafter = _need(settings)
    return DrafterProposer(_drafter(drafter), drafter.tokens)


def make_hybrid(settings: ProposerSettings) -> HybridProposer:
    """The ``agentspec-hybrid`` proposer: the index and the head, by agentspec's rule
    (``--agentspec-drafter-rule expected``, the server's default)."""
    return _hybrid(settings, "expected")


def make_hybrid_arctic(settings: ProposerSettings) -> HybridProposer:
    """The ``agentspec-hybrid-arctic`` proposer: the index and the head, by Arctic
    Inference's rule (``--agentspec-drafter-rule score``)."""
    return _hybrid(settings, "score")


def _hybrid(settings: ProposerSettings, rule: Literal["expected", "score"]) -> HybridProposer:
    from agentspec.replay.driver_proposer import make_agentspec_index

    drafter = _need(settings)
    return HybridProposer(make_agentspec_index(settings), _drafter(drafter), drafter.tokens, HybridRule(rule))
