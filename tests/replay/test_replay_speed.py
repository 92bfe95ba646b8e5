"""Estimated tokens/s from a replay (agentspec.replay.speed_table) on the bundled slice: the
draft outcomes the replay records, the fixed rule's caps, the model budget never behind
the fixed rule, and ``agentspec bench --speed-model``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agentspec.draft_budget.batch_budget import BatchBudget
from agentspec.draft_budget.speed_budget import CUT_PROBS, fastest_limits
from agentspec.draft_budget.speed_model import DraftOutcomes, parse_speed_model
from agentspec.replay.cli import bench
from agentspec.replay.config import ReplayConfig
from agentspec.replay.run import ReplayResult, run_replay
from agentspec.replay.speed_table import CONCURRENCIES, NO_SPECULATION, speed_table


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> ReplayResult:
    config = ReplayConfig(
        proposers=("vllm-suffix", "agentspec", "oracle"),
        sources=("codet", "tau_bench"),
        limit=3,
        cache_dir=tmp_path_factory.mktemp("cache"),
    )
    return run_replay(config)


def test_the_replay_records_every_proposal_by_outcome(result: ReplayResult) -> None:
    for record in result.records:
        rows = record.draft_outcomes
        assert sum(n for _, _, n in rows) == record.steps - record.calls  # one per step after prefill
        assert sum(d * n for d, _, n in rows) == record.drafted_tokens
        assert sum(a * n for _, a, n in rows) == record.accepted_tokens
        assert record.context_tokens_per_step > 0


def test_agentspec_records_what_each_probability_cut_would_keep(result: ReplayResult) -> None:
    for record in result.records:
        if record.proposer != "agentspec":
            assert record.draft_outcomes_by_cut == {}  # no path probabilities to cut on
            continue
        by_cut = {float(cut): DraftOutcomes.of(rows) for cut, rows in record.draft_outcomes_by_cut.items()}
        assert sorted(by_cut) == list(CUT_PROBS)
        assert sorted(record.draft_outcomes_by_cut["0.0"]) == sorted(record.draft_outcomes)
        previous = None
        for cut in CUT_PROBS:  # every cut sees every proposal; a higher cut keeps less
            outcomes = by_cut[cut]
            assert outcomes.proposals == record.steps - record.calls
            if previous is not None:
                assert outcomes.verified() <= previous.verified() and outcomes.emitted() <= previous.emitted()
            previous = outcomes
        assert by_cut[0.8].verified() < by_cut[0.0].verified()  # some drafts have an unlikely tail


def test_the_model_budget_row_is_the_servers_choice_of_cap_and_cut(result: ReplayResult) -> None:
    model = parse_speed_model("h100:70b")
    table = speed_table(result, model)
    best = table.row("agentspec (model budget)")
    record = result.record("agentspec")
    outcomes = DraftOutcomes.of(record.draft_outcomes)
    by_cut = {float(cut): DraftOutcomes.of(rows) for cut, rows in record.draft_outcomes_by_cut.items()}
    drafter_s = {
        d: (record.index_us_per_call * record.calls / record.steps + d * record.propose_us_per_step) / 1e6
        for d in (True, False)
    }
    for c in CONCURRENCIES:
        batch = model.batch_for(c, record.context_tokens_per_step)
        limits = fastest_limits(model, batch, record.context_tokens_per_step, by_cut, drafter_s, outcomes.longest)
        assert (best.caps[c], best.min_probs.get(c, 0.0)) == (limits.tokens, limits.min_prob)
        assert best.tokens_per_s[c] == pytest.approx(limits.tokens_per_s)
        cap_only = max(
            model.tokens_per_second(
                c, record.context_tokens_per_step, outcomes.emitted(k), outcomes.verified(k), drafter_s[True]
            )
            for k in range(1, outcomes.longest + 1)
        )
        assert best.tokens_per_s[c] >= cap_only * (1 - 1e-12)


@pytest.mark.parametrize("spec", ["h100:8b", "h200:70b"])
def test_the_model_budget_is_never_behind_the_fixed_rule(result: ReplayResult, spec: str) -> None:
    model = parse_speed_model(spec)
    table = speed_table(result, model)
    assert [r.name for r in table.rows] == [
        NO_SPECULATION,
        "vllm-suffix",
        "agentspec (fixed rule)",
        "agentspec (model budget)",
    ]
    agentspec = result.record("agentspec")
    outcomes = DraftOutcomes.of(agentspec.draft_outcomes)
    rule = BatchBudget(outcomes.longest)
    fixed, best = table.row("agentspec (fixed rule)"), table.row("agentspec (model budget)")
    for c in CONCURRENCIES:
        assert fixed.caps[c] == rule.tokens_for(table.batch[c])
        assert best.tokens_per_s[c] >= fixed.tokens_per_s[c]
        assert 0 <= best.caps[c] <= outcomes.longest  # type: ignore[operator]
        assert table.row(NO_SPECULATION).tokens_per_s[c] == model.tokens_per_second(c, table.context_tokens)
    # Concurrency adds throughput until the KV cache is full.
    speeds = [table.row(NO_SPECULATION).tokens_per_s[c] for c in CONCURRENCIES]
    assert speeds == sorted(speeds)
    # vLLM's suffix row: its own drafts at full length and its measured drafter time.
    suffix = result.record("vllm-suffix")
    drafts = DraftOutcomes.of(suffix.draft_outcomes)
    drafter_s = (suffix.index_us_per_call * suffix.calls / suffix.steps + suffix.propose_us_per_step) / 1e6
    expected = model.tokens_per_second(
        1, suffix.context_tokens_per_step, drafts.emitted(), drafts.verified(), drafter_s
    )
    assert table.row("vllm-suffix").tokens_per_s[1] == pytest.approx(expected)


def test_bench_prints_and_writes_the_estimate(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(bench)
    app.command()(lambda: None)
    common = ["bench", "--cache-dir", str(tmp_path / "cache"), "--quiet", "--sources", "codet", "--limit", "2"]
    out = tmp_path / "r.json"
    ok = CliRunner().invoke(
        app,
        [*common, "--proposers", "vllm-suffix,agentspec", "--speed-model", "h100:8b"]
        + ["--speed-model", "h200:70b", "--json", str(out)],
        env={"COLUMNS": "160"},
    )
    assert ok.exit_code == 0, ok.output
    assert "Estimated tokens/s: H100 SXM" in ok.output and "agentspec (model budget)" in ok.output
    assert "Estimated tokens/s: H200, Llama-3-70B shape, tensor parallel 2" in ok.output
    speed, second = json.loads(out.read_text())["speed"]
    assert speed["gpu"] == "H100 SXM" and speed["tensor_parallel"] == 1 and second["gpu"] == "H200"
    assert {r["name"] for r in speed["rows"]} >= {NO_SPECULATION, "vllm-suffix", "agentspec (model budget)"}
    bad = CliRunner().invoke(app, [*common, "--speed-model", "h100:9b"])
    assert bad.exit_code == 2
    assert bad.output.strip().splitlines() == [
        (
            "error: agentspec bench: speed model 'h100:9b': expected GPU:MODEL with GPU one of ['h100', 'h200'] "
            "and MODEL one of ['32b', '70b', '8b']"
        )
    ]
    only_oracle = CliRunner().invoke(app, [*common, "--proposers", "oracle", "--speed-model", "h100:8b"])
    assert only_oracle.exit_code == 2 and "oracle is not a drafter" in only_oracle.output


@pytest.mark.parametrize(
    ("load", "own", "busy"),
    [((0.5, 0.4), 1, False), ((1.4, 1.2), 1, False), ((3.5, 2.0), 1, True), ((3.5, 3.5), 3, False)],
    ids=["quiet", "this replay alone", "other work", "parallel jobs are the replay's own"],
)
def test_the_table_says_when_the_drafter_times_were_measured_on_a_busy_machine(
    result: ReplayResult, load: tuple[float, float], own: int, busy: bool
) -> None:
    """Measured drafter times inflate under load and can turn the ratios around: the table
    records the load (in its JSON) and the printed table warns when other work exceeded
    half the CPUs."""
    from rich.console import Console

    from agentspec.replay.report import print_speed_table
    from agentspec.replay.speed_table import MeasuredOn

    on = MeasuredOn(cpus=4, load_1m=load[0], load_5m=load[1], own_processes=own)
    table = speed_table(result, parse_speed_model("h100:8b"), measured_on=on)
    assert table.model_dump(mode="json")["measured_on"] == {
        "cpus": 4,
        "load_1m": load[0],
        "load_5m": load[1],
        "own_processes": own,
        "busy": busy,
    }
    console = Console(record=True, width=400)
    print_speed_table(table, console)
    text = console.export_text()
    assert ("warning: drafter times measured on a busy machine" in text) is busy
    assert "on 4 CPUs" in text


def test_this_machines_load_is_read() -> None:
    from agentspec.replay.speed_table import MeasuredOn

    on = MeasuredOn.now(own_processes=2)
    assert on is not None and on.cpus >= 1 and on.load_1m >= 0 and on.own_processes == 2
