"""The replay's model drafter beside the index (``agentspec-hybrid``) and alone (``drafter``):
the hybrid takes the model's draft by the server's rule, learns from what the model's drafts
deliver, and counts what the server's metrics count.

The drafters here are scripted (one that drafts the recorded text, one that drafts nothing
the text holds), so that what the rule should do is known; the trained head's drafting is
tested in test_head_drafter.py and end to end in test_bench_drafter.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from agentspec.draft_budget.drafter_choice import HybridRule
from agentspec.replay.calls import CallSpec, StaticCall, static_call
from agentspec.replay.config import ReplayConfig
from agentspec.replay.driver_proposer import make_agentspec_index
from agentspec.replay.model_drafting import HYBRID_COUNTERS, DrafterProposer, HybridProposer
from agentspec.replay.proposer import ProposerSettings
from agentspec.replay.run import replay_workloads
from agentspec.replay.simulate import SourceResult


def agent_call(session: str, turn: int, prompt: list[int], output: list[int], group: str) -> StaticCall:
    spec = CallSpec(f"{session}#{turn}", session, group, session, turn, "toy")
    return static_call(spec, prompt, output)


TOKENS = 3


class RecordedTextDrafter:
    """Drafts the recorded continuation (every draft is right)."""

    def call_chains(self, stream: str, prompt: Sequence[int], output: Sequence[int], tokens: int) -> list[list[int]]:
        return [list(output[i + 1 : i + 1 + tokens]) for i in range(len(output) - 1)]

    def forget(self, stream: str) -> None:
        pass


class WrongDrafter:
    """Drafts a token no recorded text holds (every draft is rejected)."""

    def call_chains(self, stream: str, prompt: Sequence[int], output: Sequence[int], tokens: int) -> list[list[int]]:
        return [[999] * tokens for _ in range(len(output) - 1)]

    def forget(self, stream: str) -> None:
        pass


def _workload(sessions: int = 4, length: int = 60) -> list[list]:
    """Sessions whose outputs are fresh text (the index has little to draft from), then a
    second call that repeats the first output (it has)."""
    rng = np.random.default_rng(1)
    out = []
    for s in range(sessions):
        prompt = [1, 2, 3, 100 + s]
        output = rng.integers(10, 900, size=length).tolist()
        out.append(
            [
                agent_call(f"s{s}", 0, prompt, output, group=f"g{s}"),
                agent_call(f"s{s}", 1, [*prompt, *output, 4], output, group=f"g{s}"),
            ]
        )
    return out


def _replay(workload: list[list], drafter: object, rule: str) -> tuple[SourceResult, object]:
    made: list[HybridProposer] = []

    def hybrid(settings: ProposerSettings) -> HybridProposer:
        proposer = HybridProposer(make_agentspec_index(settings), drafter, TOKENS, HybridRule(rule))  # type: ignore[arg-type]
        made.append(proposer)
        return proposer

    def alone(settings: ProposerSettings) -> DrafterProposer:
        return DrafterProposer(drafter, TOKENS)  # type: ignore[arg-type]

    config = ReplayConfig(proposers=("agentspec", "hybrid", "alone"), baseline="agentspec", concurrency=1)
    (result,) = replay_workloads(config, {"toy": workload}, proposers={"hybrid": hybrid, "alone": alone})
    return result, made[0]


def _al(result: SourceResult, name: str) -> float:
    t = result.tallies[name]
    return t.output_tokens / t.steps


def test_a_drafter_that_is_right_drafts_where_the_index_cannot() -> None:
    workload = _workload()
    result, _ = _replay(workload, RecordedTextDrafter(), "expected")
    counts = result.tallies["hybrid"].counters
    assert set(counts) == set(HYBRID_COUNTERS)
    # Fresh text: the index alone barely drafts; the model's drafts are all accepted.
    assert _al(result, "hybrid") > 1.5 * _al(result, "agentspec")
    assert counts["model_drafts"] > 0 and counts["suffix_drafts"] > 0
    assert counts["model_accepted_tokens"] >= 0.95 * counts["model_draft_tokens"]
    # Every decoding step after the prefill is a run or a skipped run of the drafter.
    assert counts["drafter_runs"] + counts["drafter_runs_skipped"] == result.tallies["hybrid"].proposals
    assert 0 < counts["hard_step_model_accepted_tokens"] <= counts["hard_step_tokens"]
    # The drafter alone drafts every step and is always right: AL = TOKENS + 1 but at the end.
    assert _al(result, "alone") > TOKENS


def test_the_expected_rule_prefers_any_index_draft_to_a_drafter_that_is_never_right() -> None:
    workload = _workload()
    expected, hybrid = _replay(workload, WrongDrafter(), "expected")
    score, _ = _replay(workload, WrongDrafter(), "score")
    e, s = expected.tallies["hybrid"].counters, score.tallies["hybrid"].counters
    assert e["model_accepted_tokens"] == s["model_accepted_tokens"] == 0
    # Its estimate falls with each rejected draft, below what any index draft expects...
    assert hybrid.rule.estimate.acceptance < 0.1  # type: ignore[attr-defined]
    # ...so the index's draft goes wherever there is one; where there is none, the model's
    # is the only draft and both rules send it.
    assert e["suffix_drafts"] > 2 * s["suffix_drafts"], (e, s)
    # Arctic's rule reads only the index's score: weak index drafts lose to the model's.
    assert s["model_drafts"] > e["model_drafts"]
    assert _al(expected, "hybrid") > _al(score, "hybrid")


@pytest.mark.parametrize("rule", ["expected", "score"])
def test_model_verdicts_reach_the_index_statistics_not_its_own(rule: str) -> None:
    workload = _workload(sessions=1)
    _, hybrid = _replay(workload, RecordedTextDrafter(), rule)
    stats = hybrid.index.stats()  # type: ignore[attr-defined]
    counts = hybrid.counters()  # type: ignore[attr-defined]
    assert counts["model_drafts"] > 0
    # Withdrawn index drafts are neither proposed nor verified in the index's counts.
    assert sum(stats.drafts_by_level.values()) == counts["suffix_drafts"], (stats, counts)
    assert sum(stats.accepted_tokens_by_level.values()) == counts["suffix_accepted_tokens"]


def test_the_hybrid_rule_refuses_an_unknown_rule() -> None:
    with pytest.raises(ValueError, match="unknown hybrid rule"):
        HybridRule("fastest")  # type: ignore[arg-type]
