"""benchmarks/hybrid_share.py: the steps the index has no confident draft for, counted on
the replay's own steps without changing what agentspec drafts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from agentspec.replay import ReplayConfig, replay_workloads
from agentspec.replay.config import bundled_data
from agentspec.replay.tokenized import TokenCache

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hybrid_share.py"
SOURCES = ("tau_bench", "codet")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hybrid_share", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def workloads(tmp_path_factory: pytest.TempPathFactory) -> dict:
    cache = TokenCache(bundled_data(), tmp_path_factory.mktemp("cache"))
    return {source: cache.load(source).workload(3) for source in SOURCES}


@pytest.mark.parametrize("source", SOURCES)
def test_shares_are_bounded_and_nested(bench: ModuleType, workloads: dict, source: str) -> None:
    c = bench.replay_share(source, workloads[source])
    thresholds = [None, *bench.THRESHOLDS]
    step_shares = [c.step_share(t) for t in thresholds]
    token_shares = [c.token_share(t) for t in thresholds]
    assert all(0.0 <= s <= 1.0 for s in step_shares + token_shares)
    # no draft <= below 1 <= below 2 <= below 4, for steps and for the tokens on them.
    assert step_shares == sorted(step_shares)
    assert token_shares == sorted(token_shares)
    # On this traffic every category occurs: steps without a draft, and confident drafts.
    assert c.no_draft_steps > 0
    assert c.below_steps[4.0] < c.drafting_steps
    # A step without a draft decodes one token; a step decodes its accepted tokens and
    # at most one more.
    assert c.no_draft_tokens == c.no_draft_steps
    for t in bench.THRESHOLDS:
        assert c.below_steps[t] <= c.below_tokens[t] <= c.below_steps[t] + c.below_accepted[t]
    # Steps whose draft is confident decode more tokens per step than the others.
    assert c.below_tokens[4.0] / c.below_steps[4.0] < c.output_tokens / c.steps


@pytest.mark.parametrize("source", SOURCES)
def test_steps_are_the_plain_replays_and_drafts_unchanged(bench: ModuleType, workloads: dict, source: str) -> None:
    c = bench.replay_share(source, workloads[source])
    (plain,) = replay_workloads(ReplayConfig(proposers=("agentspec",)), {source: workloads[source]})
    tally = plain.tallies["agentspec"]
    assert (c.calls, c.steps, c.output_tokens) == (tally.calls, tally.steps, tally.output_tokens)
    # What is drafted and accepted is agentspec's own.
    assert (c.drafted_tokens, c.accepted_tokens) == (tally.drafted_tokens, tally.accepted_tokens)
    # Every step after a call's prefill is counted once; "no draft" is the replay's empty drafts.
    assert c.drafting_steps == tally.proposals == tally.steps - tally.calls
    assert c.no_draft_steps == sum(n for (drafted, _), n in tally.outcomes.items() if drafted == 0)


def test_nothing_to_draft_from_is_all_no_draft(bench: ModuleType, make_call) -> None:
    # Every token new: the index never has a draft.
    calls = [make_call(f"t{i}", 0, [1000 * i + 1, 1000 * i + 2], list(range(1000 * i + 10, 1000 * i + 30))) for i in range(3)]
    c = bench.replay_share("toy", [[call] for call in calls])
    assert c.steps == c.output_tokens == 3 * 20
    assert c.drafting_steps == c.no_draft_steps == 3 * 19  # the prefill steps draft nothing
    assert all(c.below_steps[t] == c.no_draft_steps for t in bench.THRESHOLDS)
    assert c.step_share(None) == pytest.approx(19 / 20)
    assert c.token_share(4.0) == pytest.approx(19 / 20)


def test_a_repeated_session_drafts_confidently(bench: ModuleType, make_call) -> None:
    # One session answering the same 40 tokens turn after turn: the first turn has nothing
    # to draft from; later ones draft it back, expected to deliver more than 4 tokens.
    out = list(range(500, 540))
    trajectory, prompt = [], [1, 2, 3]
    for turn in range(30):
        trajectory.append(make_call("t", turn, prompt, out))
        prompt = [*prompt, *out, 4]
    c = bench.replay_share("toy", [trajectory])
    assert c.no_draft_steps == len(out) - 1  # the first turn's steps after its prefill
    assert c.below_steps[4.0] <= c.no_draft_steps + 2
    assert c.step_share(4.0) < 0.5
