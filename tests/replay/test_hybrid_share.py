"""agentspec.replay.hybrid_share: the steps the index has no confident draft for, counted on
the replay's own steps without changing what agentspec drafts; and its two command lines,
``agentspec bench --hybrid-share`` and benchmarks/hybrid_share.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import typer
from typer.testing import CliRunner

from agentspec.replay import ReplayConfig, replay_workloads
from agentspec.replay import hybrid_share as share
from agentspec.replay.config import bundled_data
from agentspec.replay.tokenized import TokenCache

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hybrid_share.py"
SOURCES = ("tau_bench", "codet")
TITLE = "Steps where the index has no confident draft"
CAVEAT = "what it would accept there is not measured; this is not a speed-up"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One token cache for the module (tokenizing the slice is the slow part)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def workloads(cache_dir: Path) -> dict:
    cache = TokenCache(bundled_data(), cache_dir)
    return {source: cache.load(source).workload(3) for source in SOURCES}


@pytest.mark.parametrize("source", SOURCES)
def test_shares_are_bounded_and_nested(workloads: dict, source: str) -> None:
    c = share.replay_share(source, workloads[source])
    thresholds = [None, *share.THRESHOLDS]
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
    for t in share.THRESHOLDS:
        assert c.below_steps[t] <= c.below_tokens[t] <= c.below_steps[t] + c.below_accepted[t]
    # Steps whose draft is confident decode more tokens per step than the others.
    assert c.below_tokens[4.0] / c.below_steps[4.0] < c.output_tokens / c.steps


@pytest.mark.parametrize("source", SOURCES)
def test_steps_are_the_plain_replays_and_drafts_unchanged(workloads: dict, source: str) -> None:
    c = share.replay_share(source, workloads[source])
    (plain,) = replay_workloads(ReplayConfig(proposers=("agentspec",)), {source: workloads[source]})
    tally = plain.tallies["agentspec"]
    assert (c.calls, c.steps, c.output_tokens) == (tally.calls, tally.steps, tally.output_tokens)
    # What is drafted and accepted is agentspec's own.
    assert (c.drafted_tokens, c.accepted_tokens) == (tally.drafted_tokens, tally.accepted_tokens)
    # Every step after a call's prefill is counted once; "no draft" is the replay's empty drafts.
    assert c.drafting_steps == tally.proposals == tally.steps - tally.calls
    assert c.no_draft_steps == sum(n for (drafted, _), n in tally.outcomes.items() if drafted == 0)


def test_nothing_to_draft_from_is_all_no_draft(make_call) -> None:
    # Every token new: the index never has a draft.
    calls = [
        make_call(f"t{i}", 0, [1000 * i + 1, 1000 * i + 2], list(range(1000 * i + 10, 1000 * i + 30))) for i in range(3)
    ]
    c = share.replay_share("toy", [[call] for call in calls])
    assert c.steps == c.output_tokens == 3 * 20
    assert c.drafting_steps == c.no_draft_steps == 3 * 19  # the prefill steps draft nothing
    assert all(c.below_steps[t] == c.no_draft_steps for t in share.THRESHOLDS)
    assert c.step_share(None) == pytest.approx(19 / 20)
    assert c.token_share(4.0) == pytest.approx(19 / 20)


def test_a_repeated_session_drafts_confidently(make_call) -> None:
    # One session answering the same 40 tokens turn after turn: the first turn has nothing
    # to draft from; later ones draft it back, expected to deliver more than 4 tokens.
    out = list(range(500, 540))
    trajectory, prompt = [], [1, 2, 3]
    for turn in range(30):
        trajectory.append(make_call("t", turn, prompt, out))
        prompt = [*prompt, *out, 4]
    c = share.replay_share("toy", [trajectory])
    assert c.no_draft_steps == len(out) - 1  # the first turn's steps after its prefill
    assert c.below_steps[4.0] <= c.no_draft_steps + 2
    assert c.step_share(4.0) < 0.5


# --- agentspec bench --hybrid-share ---------------------------------------------------


def run_bench(app: typer.Typer, cache_dir: Path, *args: str) -> str:
    result = CliRunner().invoke(
        app,
        ["bench", "--cache-dir", str(cache_dir), "--ngram-impl", "numpy", "--quiet", *args],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def words(text: str) -> str:
    """The text with its line breaks and runs of spaces as single spaces (rich wraps)."""
    return " ".join(text.split())


def all_sources_row(output: str) -> list[str]:
    (line,) = [line for line in output.splitlines() if "all sources" in line]
    return [cell.strip() for cell in line.strip(" │┃|").split("│")]


def check_share_json(doc: dict, sources: tuple[str, ...]) -> dict:
    shares = doc["hybrid_share"]
    assert list(shares) == [*sources, "all"]
    for name, c in shares.items():
        fractions = [c["no_draft_step_share"], *c["below_step_share"].values()]
        token_fractions = [c["no_draft_token_share"], *c["below_token_share"].values()]
        assert set(c["below_step_share"]) == {str(t) for t in share.THRESHOLDS}
        assert all(0.0 <= x <= 1.0 for x in fractions + token_fractions), (name, c)
        assert fractions == sorted(fractions) and token_fractions == sorted(token_fractions)
        assert c["no_draft_step_share"] == pytest.approx(c["no_draft_steps"] / c["steps"])
        assert c["below_token_share"]["2.0"] == pytest.approx(c["below_tokens"]["2.0"] / c["output_tokens"])
        assert 0 < c["no_draft_steps"] < c["drafting_steps"] < c["steps"]
    for key in ("calls", "steps", "output_tokens", "no_draft_steps"):
        assert shares["all"][key] == sum(shares[s][key] for s in sources)
    # The share replays agentspec as the bench did: the same steps, drafts and acceptances.
    agentspec = {r["source"]: r for r in doc["records"] if r["proposer"] == "agentspec"}
    for name in (*sources, "all"):
        for key in ("calls", "steps", "output_tokens", "drafted_tokens", "accepted_tokens"):
            assert shares[name][key] == agentspec[name][key], (name, key)
    return shares


def test_bench_prints_the_hybrid_share_and_writes_it_to_json(app: typer.Typer, cache_dir: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    output = run_bench(
        app,
        cache_dir,
        "--sources",
        ",".join(SOURCES),
        "--limit",
        "2",
        "--proposers",
        "vllm-suffix,agentspec",
        "--hybrid-share",
        "--json",
        str(out_json),
    )
    text = words(output)
    assert f"{TITLE} (E: its expected accepted tokens), at most 2 trajectories per source, one server" in text
    assert CAVEAT in text
    # After the replay's own report.
    assert text.index("agentspec bench") < text.index(TITLE) < text.index(CAVEAT)
    shares = check_share_json(json.loads(out_json.read_text()), SOURCES)
    # The table's 'all sources' row is the JSON's.
    total = shares["all"]
    row = all_sources_row(output)
    assert row[:3] == ["all sources", str(total["calls"]), str(total["steps"])]
    assert row[3] == f"{100 * total['no_draft_step_share']:.1f}%"
    assert row[6] == f"{100 * total['below_step_share']['4.0']:.1f}%"
    assert row[10] == f"{100 * total['below_token_share']['4.0']:.1f}%"


def test_bench_hybrid_share_follows_the_benchs_servers_window_and_jobs(
    app: typer.Typer, cache_dir: Path, tmp_path: Path
) -> None:
    # Two servers that agentspec's calls are spread over, condensed prompts, two processes:
    # the share's steps are still the bench's agentspec steps (check_share_json).
    out_json = tmp_path / "r.json"
    output = run_bench(
        app,
        cache_dir,
        "--sources",
        ",".join(SOURCES),
        "--limit",
        "2",
        "--proposers",
        "agentspec",
        "--replicas",
        "2",
        "--routing",
        "spread",
        "--window",
        "1500",
        "--jobs",
        "2",
        "--hybrid-share",
        "--json",
        str(out_json),
    )
    assert "at most 2 trajectories per source, 2 servers" in words(output)
    check_share_json(json.loads(out_json.read_text()), SOURCES)


def test_bench_without_the_flag_has_no_hybrid_share(app: typer.Typer, cache_dir: Path, tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    output = run_bench(
        app, cache_dir, "--sources", "tau_bench", "--limit", "1", "--proposers", "agentspec", "--json", str(out_json)
    )
    assert TITLE not in words(output) and "all sources" not in output
    assert "hybrid_share" not in json.loads(out_json.read_text())


# --- benchmarks/hybrid_share.py ---------------------------------------------------------


@pytest.fixture(scope="module")
def script() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("hybrid_share_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_the_script_prints_the_same_counts(
    script: ModuleType, cache_dir: Path, workloads: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTSPEC_CACHE_DIR", str(cache_dir.parent / "script-cache"))
    out_json = tmp_path / "share.json"
    app = typer.Typer()
    app.command()(script.main)
    args = ["--data", str(bundled_data()), "--limit", "3", "--json", str(out_json)]
    result = CliRunner().invoke(app, [*args, *(a for s in SOURCES for a in ("--source", s))])
    assert result.exit_code == 0, result.output + repr(result.exception)
    text = words(result.output)
    assert f"{TITLE} (E: its expected accepted tokens), at most 3 trajectories per source, one server" in text
    assert CAVEAT in text
    doc = json.loads(out_json.read_text())
    assert list(doc) == [*SOURCES, "all"]
    for source in SOURCES:
        expected = share.share_json({source: share.replay_share(source, workloads[source])})[source]
        assert doc[source] == json.loads(json.dumps(expected))
