"""The docs' measured figures against the JSON they came from (scripts/check_doc_figures.py):
every figure quoted in a page's text is checked, every table is made from the JSON, and a
changed value in the JSON fails the check. Markdown and JSON only: no site build."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "check_doc_figures.py"
RESULTS = ROOT / "benchmarks" / "results"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("check_doc_figures", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_doc_figures", module)
    spec.loader.exec_module(module)
    return module


figures = _module()


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def _counts(stdout: str) -> tuple[int, int]:
    match = re.search(r"checked (\d+) figures quoted in the docs and (\d+) tables", stdout)
    assert match, stdout
    return int(match.group(1)), int(match.group(2))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A copy of benchmarks/results/ to change."""
    return Path(shutil.copytree(RESULTS, tmp_path / "results"))


def _edit(path: Path, change: Any) -> None:
    data = figures.Results(path.parent).json(path.name)
    change(data)
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)


def _record(run: dict[str, Any], proposer: str, source: str) -> dict[str, Any]:
    return next(r for r in run["records"] if r["proposer"] == proposer and r["source"] == source)


def test_every_figure_the_docs_quote_matches_its_json() -> None:
    done = _check()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    checked, tables = _counts(done.stdout)
    assert checked >= 80, done.stdout
    assert tables >= 7, done.stdout


def test_a_changed_replay_figure_fails_the_check(results: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        _record(data["one_server"], "agentspec", "all")["al_vs_baseline"] += 0.01

    _edit(results / figures.TARGETS, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "policy.md" in done.stderr and "al_vs_baseline" in done.stderr
    assert re.search(r"shows 1\.\d{3} where .* gives 1\.\d{3}", done.stderr), done.stderr


def test_a_changed_step_time_fails_the_check(results: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        row = next(
            r for r in data["rows"] if (r["model"], r["context"], r["batch"], r["verified"]) == ("8b", 8192, 1, 1)
        )
        row["seconds"] *= 1.1

    _edit(results / figures.STEPS, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "engine.md: 'a step of one request costs {} ms with 1 verified token and {} ms with 16' shows" in done.stderr
    assert "speed.md: table 'h200-calibration-rows' does not render from the results" in done.stderr


def test_a_changed_hybrid_share_fails_the_check_and_changes_its_table(results: Path) -> None:
    marker = "<!-- agentspec:table dev-hybrid-share -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("| source | steps | no draft | E<1 | E<2 | E<4 | tokens on E<2 steps |")
    assert "| **all sources** |" in table
    assert "`benchmarks/results/dev-hybrid-share.json`, written by `python benchmarks/hybrid_share.py" in table

    def change(data: dict[str, Any]) -> None:
        data["all"]["below_step_share"]["2.0"] += 0.01
        data["codet"]["no_draft_step_share"] = 0.9876

    _edit(results / figures.HYBRID_SHARE, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "engine.md: 'Over all sources, {} steps: {}% of them" in done.stderr
    assert re.search(r"shows \d+\.\d where .*below_step_share.* gives \d+\.\d", done.stderr), done.stderr
    changed = figures.render_tables(marker, figures.Results(results))
    assert "| codet |" in changed and "| 98.8% |" in changed and changed != table


def test_a_changed_policy_sweep_fails_the_check_and_changes_its_table(results: Path) -> None:
    marker = "<!-- agentspec:table dev-policy-sweep -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("| policy | AL ratio (all) | lowest AL ratio | acc tau_bench | acc openhands |")
    assert "| **defaults (factor 2.0, min prob 0.2, calibrated)** |" in table
    assert "| not calibrated, min prob 0.3 (the earlier defaults) |" in table

    def change(data: dict[str, Any]) -> None:
        row = next(r for r in data["policies"] if r["policy"] == {"min_token_prob": 0.3})
        row["al_ratio"]["all"] += 0.01

    _edit(results / figures.SWEEP, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "policy.md: 'at the same minimum probability it raises AL ({} to {} at 0.3)" in done.stderr
    assert re.search(r"shows 1\.\d{3} where .*al_ratio.* gives 1\.\d{3}", done.stderr), done.stderr
    assert figures.render_tables(marker, figures.Results(results)) != table


def test_a_changed_chooser_fit_fails_the_check_and_changes_its_table(results: Path) -> None:
    marker = "<!-- agentspec:table dev-chooser-fit -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("| on the held steps, same candidates | accepted tokens | vs the calibrated score |")
    assert "| calibrated score (the index's rule) |" in table and "| 1.000 |" in table

    def change(data: dict[str, Any]) -> None:
        data["held"]["accepted"]["hindsight"] *= 1.1

    _edit(results / figures.CHOOSER, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "policy.md: 'Even the hindsight choice, {}% more accepted tokens' shows" in done.stderr
    assert figures.render_tables(marker, figures.Results(results)) != table


def test_a_changed_rl_routing_figure_fails_the_check_and_changes_its_table(results: Path) -> None:
    marker = "<!-- agentspec:table dev-rl-routing -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert "| codet, first 60 | 60 |" in table and "| tot, all | 330 |" in table

    def change(data: dict[str, Any]) -> None:
        data["sources"]["tot"]["al"]["agentspec, client"] *= 1.1

    _edit(results / figures.RL_ROUTING_60, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "rl.md: 'Pinning is worth most on the first 60 ({}×).' shows 1.52 where" in done.stderr
    assert figures.render_tables(marker, figures.Results(results)) != table


def test_a_changed_rl_epoch_fails_the_check_and_changes_its_table(results: Path) -> None:
    marker = "<!-- agentspec:table dev-rl-epochs -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("| source | groups | vLLM suffix | agentspec, kept | agentspec, retired | kept / retired |")

    def change(data: dict[str, Any]) -> None:
        data["sources"]["codet"]["al"]["vllm-suffix"] += 0.01

    _edit(results / figures.RL_EPOCHS, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "rl.md: \"vLLM's suffix method reaches {} on codet's epoch 2" in done.stderr
    assert figures.render_tables(marker, figures.Results(results)) != table


def test_a_changed_dev_speed_figure_fails_the_check_and_changes_its_table(results: Path) -> None:
    marker = "<!-- agentspec:table dev-speed -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("| proposer | c=1 | c=8 | c=32 | c=64 | c=128 |")
    assert "| agentspec, model budget | " in table and "(1.09×, k=32)" in table
    assert "`benchmarks/results/dev-speed.json.gz`, written by `agentspec bench --data data/trajectories-dev" in table

    def change(data: dict[str, Any]) -> None:
        _record(data, "agentspec", "all")["propose_us_per_step"] += 10
        (h100_8b,) = [t for t in data["speed"] if (t["gpu"], t["model"]) == ("H100 SXM", "Llama-3-8B shape")]
        next(r for r in h100_8b["rows"] if r["name"] == "agentspec (model budget)")["tokens_per_s"]["64"] *= 1.1

    _edit(results / figures.SPEED_DEV, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "speed.md: 'AL was {} for vllm-suffix and {} for agentspec" in done.stderr
    assert "speed.md: '- H100 with the 8B model: {}×, {}×, {}×, {}×, {}×' shows" in done.stderr
    assert figures.render_tables(marker, figures.Results(results)) != table


def test_a_changed_slice_speed_figure_fails_the_check_and_changes_its_table(results: Path) -> None:
    marker = "<!-- agentspec:table slice-speed -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("| proposer | c=1 | c=8 | c=32 | c=64 | c=128 |")
    assert "`benchmarks/results/slice-speed.json.gz`, written by `agentspec bench --proposers" in table

    def change(data: dict[str, Any]) -> None:
        _record(data, "agentspec", "all")["al"] += 0.1
        (h200_8b,) = [t for t in data["speed"] if (t["gpu"], t["model"]) == ("H200", "Llama-3-8B shape")]
        next(r for r in h200_8b["rows"] if r["name"] == "agentspec (model budget)")["tokens_per_s"]["32"] *= 1.1
        (h100_8b,) = [t for t in data["speed"] if (t["gpu"], t["model"]) == ("H100 SXM", "Llama-3-8B shape")]
        next(r for r in h100_8b["rows"] if r["name"] == "vllm-suffix")["tokens_per_s"]["8"] += 100

    _edit(results / figures.SPEED_SLICE, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert 'speed.md: "The run used the bundled slice: {} trajectories' in done.stderr
    assert "speed.md: 'On the H200 with the 8B model, the model budget is {}×" in done.stderr
    assert figures.render_tables(marker, figures.Results(results)) != table


def test_the_window_and_seeding_table_is_made_from_the_json(results: Path) -> None:
    marker = "<!-- agentspec:table dev-window-seeding -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("| prompts | vllm-suffix AL | agentspec AL | agentspec / suffix |")
    assert "| window 1024, condenser seeding | " in table and "--seed-dropped --json" in table

    def change(data: dict[str, Any]) -> None:
        _record(data, "agentspec", "openhands_mocks")["al"] += 0.1
        _record(data, "agentspec", "all")["al"] += 0.1

    _edit(results / figures.WINDOW_SEEDED, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "bench.md: 'On one server seeding gains nothing ({}× of the AL without it)' shows" in done.stderr
    assert figures.render_tables(marker, figures.Results(results)) != table


def test_the_calibration_tables_and_figures_come_from_the_json(results: Path) -> None:
    markers = "<!-- agentspec:table h200-calibration -->\n<!-- agentspec:table h200-calibration-rows -->"
    tables = figures.render_tables(markers, figures.Results(RESULTS))
    assert "| the model with its defaults (the fit of these steps) | 4.8% | 13.9% |" in tables
    assert "| 32B | 2,048 | 128 | 16 | 269.4 | 234.3 | −13% |" in tables

    def change(data: dict[str, Any]) -> None:
        data["defaults"]["rms"] += 0.01
        data["refit"]["fields"]["kv_efficiency"] = 0.7
        data["rows"][0]["error"] += 0.1

    _edit(results / figures.CALIBRATION, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "speed.md: 'the sum comes within {}% RMS of the measured steps" in done.stderr
    assert "speed.md: '| `kv_efficiency` | {} |' shows 0.63" in done.stderr
    assert figures.render_tables(markers, figures.Results(results)) != tables


def test_the_exchange_throughput_comes_from_its_json(results: Path) -> None:
    marker = "<!-- agentspec:table exchange-throughput -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("|  | outputs/s |")
    assert "| read by each of 7 replicas | " in table and "exchange_throughput.py --json" in table

    def change(data: dict[str, Any]) -> None:
        data["catch_up"]["us_per_token"] += 0.5
        data["transport"]["read_per_s"] += 1000

    _edit(results / figures.EXCHANGE_THROUGHPUT, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "fleet.md: \"Indexing a peer's output costs about {} µs per token" in done.stderr
    assert figures.render_tables(marker, figures.Results(results)) != table


def test_the_rl_readme_figures_are_checked(results: Path) -> None:
    def change(data: dict[str, Any]) -> None:
        data["sources"]["tot"]["al"]["agentspec, kept"] += 0.01

    _edit(results / figures.RL_EPOCHS, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "../integrations/rl/README.md: '| tot | {} | {} | {} | {} | {}× |' shows" in done.stderr


def test_changed_policy_measurements_fail_the_check(results: Path) -> None:
    def cost(data: dict[str, Any]) -> None:
        data["prompt_side"]["session_us_per_token"] += 0.5

    def headroom(data: dict[str, Any]) -> None:
        data["sources"]["tot"]["vs_agentspec"]["hindsight-level"] += 0.5

    def longer(data: dict[str, Any]) -> None:
        _record(data, "agentspec", "all")["al_vs_baseline"] += 0.05

    for file, change in ((figures.INDEX_COST, cost), (figures.HEADROOM, headroom), (figures.BENCH40_LONG, longer)):
        _edit(results / file, change)
    done = _check("--results", str(results))
    assert done.returncode == 1
    assert "policy.md: \"measured: {} of a call's {} prompt tokens" in done.stderr
    assert "policy.md: 'that choice: +{}% to +{}% AL by source)' shows" in done.stderr
    assert 'policy.md: "AL went from {}x to {}x' in done.stderr


def test_a_passage_gone_from_its_page_fails_the_check(tmp_path: Path) -> None:
    docs = Path(shutil.copytree(ROOT / "docs", tmp_path / "docs"))
    page = docs / "engine.md"
    text = re.sub(r"\s+", " ", page.read_text())
    page.write_text(text.replace("ms with the exchange, in a run", "ms when exchanging, in a run"))
    done = _check("--docs", str(docs))
    assert done.returncode == 1
    assert "engine.md: the passage '(index time per call {} ms without, {} ms with the exchange," in done.stderr
    assert "is not on the page" in done.stderr


def test_nothing_checked_fails(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    done = _check("--docs", str(tmp_path / "docs"))
    assert done.returncode == 1
    assert _counts(done.stdout) == (0, 0)


def test_tables_are_made_from_the_json(results: Path) -> None:
    marker = "before\n<!-- agentspec:table dev-one-server -->\nafter"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("before\n| source | calls | AL suffix | AL agentspec | AL ratio | acceptance ratio |")
    assert "`benchmarks/results/dev-replay-targets.json.gz`, written by `python benchmarks/replay_targets.py" in table

    def change(data: dict[str, Any]) -> None:
        _record(data["one_server"], "agentspec", "codet")["al"] = 9.876

    _edit(results / figures.TARGETS, change)
    changed = figures.render_tables(marker, figures.Results(results))
    assert "| codet |" in changed and "| 9.876 |" in changed and changed != table
    with pytest.raises(KeyError, match="unknown table marker 'nope'"):
        figures.render_tables("<!-- agentspec:table nope -->", figures.Results(RESULTS))


def test_every_table_marker_in_the_docs_is_known() -> None:
    names = {m for page in (ROOT / "docs").glob("*.md") for m in figures.TABLE_MARKER.findall(page.read_text())}
    assert names == set(figures.TABLES)


def test_the_wire_contract_names_every_reserved_key_and_seed_field() -> None:
    from agentspec import wire

    text = re.sub(r"\s+", " ", (ROOT / "docs" / "wire.md").read_text())
    reserved = text[text.index("## Reserved and refused") :]
    reserved = reserved[: reserved.index("## ", 3)]
    for key in (
        wire.XARG_SEEDS,
        wire.XARG_SEED_ONLY,
        wire.XARG_POLICY_VERSION,
        wire.XARG_KEEP_OLD_OUTPUTS,
        wire.XARG_TENANT,
        wire.XARG_ADMISSION,
    ):
        assert f"`{key}`" in reserved, key
    seeds = text[text.index("## Seeds without generating") :]
    seeds = seeds[: seeds.index("## ", 3)]
    for field in wire.SEEDS_REQUEST_FIELDS:
        assert f"`{field}`" in seeds, field


def test_the_suffix_baselines_table_is_made_from_the_json(results: Path) -> None:
    marker = "<!-- agentspec:table dev-suffix-034 -->"
    table = figures.render_tables(marker, figures.Results(RESULTS))
    assert table.startswith("| source | calls | AL vllm-suffix | AL vllm-suffix-0.32 | AL agentspec |")
    # Recorded with today's names: no note that vllm-suffix meant 0.32's tree there.
    assert "0.32's suffix tree" not in table

    def change(data: dict[str, Any]) -> None:
        _record(data, "vllm-suffix", "codet")["al"] = 9.876

    _edit(results / figures.SUFFIX_034, change)
    assert "| 9.876 |" in figures.render_tables(marker, figures.Results(results))


def test_tables_recorded_with_the_old_suffix_baseline_say_so() -> None:
    table = figures.render_tables("<!-- agentspec:table dev-one-server -->", figures.Results(RESULTS))
    assert "There `vllm-suffix` is vLLM 0.32's suffix tree (today's `vllm-suffix-0.32`)." in table
    # Every results file that names vllm-suffix without today's 0.32 name is of that era.
    for path in RESULTS.iterdir():
        if path.name.endswith((".json", ".json.gz")):
            text = json.dumps(figures.Results(RESULTS).json(path.name))
            if '"vllm-suffix' in text and "vllm-suffix-0.32" not in text and '"vllm": "0.34' not in text:
                assert path.name in figures.SUFFIX_TREE_ERA, path.name
