"""benchmarks/rl_routing.py and benchmarks/rl_epochs.py run on the bundled slice (its few
codet and tot groups), so that they cannot rot: each prints a row per source whose ratio
says what the docs say it measures (pinning beats spreading; kept outputs beat retired)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import typer
from typer.testing import CliRunner

# The replays run the draft index; the light install (client only) has no suffix tree.
pytest.importorskip(
    "arctic_inference", reason="the replays need the bench extra (arctic-inference): not in the light install"
)

from agentspec.replay.config import bundled_data  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
SOURCES = ("codet", "tot")


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def run(name: str, cache_dir: Path) -> dict[str, list[str]]:
    """The script's table on the bundled slice: each source's cells, by source."""
    app = typer.Typer()
    app.command()(load(name).main)
    args = ["--data", str(bundled_data()), "--sources", ",".join(SOURCES), "--cache-dir", str(cache_dir)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [
        [c.strip() for c in line.strip("│ ").split("│")] for line in result.output.splitlines() if line.startswith("│")
    ]
    return {cells[0]: cells[1:] for cells in rows}


def ratio(cell: str) -> float:
    assert cell.endswith("x"), cell
    return float(cell[:-1])


def test_routing_pins_groups_and_beats_spreading(cache_dir: Path) -> None:
    table = run("rl_routing", cache_dir)
    assert set(table) == set(SOURCES)
    for source, (trajectories, *als, agentspec_ratio, suffix_ratio) in table.items():
        assert int(trajectories) >= 1 and all(float(al) >= 1.0 for al in als), source
        # agentspec pinned / spread is the ratio of its first two AL columns.
        assert ratio(agentspec_ratio) == pytest.approx(float(als[0]) / float(als[1]), abs=0.01)
        assert ratio(agentspec_ratio) > 1.0 and ratio(suffix_ratio) > 1.0, source


def test_epochs_keep_or_retire_the_last_epochs_outputs(cache_dir: Path) -> None:
    table = run("rl_epochs", cache_dir)
    assert set(table) == set(SOURCES)
    for source, (groups, suffix, kept, retired, kept_ratio) in table.items():
        assert int(groups) >= 1 and float(suffix) >= 1.0, source
        assert ratio(kept_ratio) == pytest.approx(float(kept) / float(retired), abs=0.01)
        # An upper bound (epoch 2 repeats epoch 1 exactly): the kept outputs must help.
        assert ratio(kept_ratio) > 1.0, source
