"""benchmarks/chooser_fit.py: its recording replays exactly what agentspec drafts, and the
script fits and judges a chooser on the bundled slice."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import typer
from typer.testing import CliRunner

from agentspec.replay import ReplayConfig, replay_workloads
from agentspec.replay.config import bundled_data
from agentspec.replay.tokenized import TokenCache

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "chooser_fit.py"
SOURCES = ("reflexion_programming", "reflexion_hotpotqa_react")  # both halves hold some


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chooser_fit", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chooser_fit"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def test_recording_drafts_what_agentspec_drafts(script: ModuleType, cache_dir: Path) -> None:
    cache = TokenCache(bundled_data(), cache_dir)
    cache.ensure(["codet"])
    workload = cache.load("codet").workload(6)
    made = []

    def recording(_settings: object):
        made.append(script._RecordingProposer(script._truth(workload), 1))
        return made[-1]

    config = ReplayConfig(proposers=("agentspec", "recording"))
    (result,) = replay_workloads(config, {"codet": workload}, proposers={"recording": recording})
    plain, recorded = result.tallies["agentspec"], result.tallies["recording"]
    assert (recorded.steps, recorded.drafted_tokens, recorded.accepted_tokens) == (
        plain.steps,
        plain.drafted_tokens,
        plain.accepted_tokens,
    )
    steps = made[0].steps
    assert steps and all(len(s.features) == len(s.accepted) for s in steps)
    # The chosen candidate's accepted tokens are what the replay credited.
    assert sum(s.accepted[s.chosen] for s in steps) == recorded.accepted_tokens


def test_the_script_fits_on_one_half_and_judges_on_the_other(script: ModuleType, cache_dir: Path) -> None:
    app = typer.Typer()
    app.command()(script.main)
    args = ["--data", str(bundled_data()), "--limit", "6", "--cache-dir", str(cache_dir)]
    for source in SOURCES:
        args += ["--source", source]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    out = " ".join(result.output.split())
    assert "log-loss fit" in out and "held steps, accepted tokens by choice" in out
    for source in SOURCES:
        assert f"│ {source} " in result.output
    fit_steps = int(out.split("fit: ")[1].split(" steps")[0].replace(",", ""))
    held_steps = int(out.split("held: ")[1].split(" steps")[0].replace(",", ""))
    assert fit_steps > 0 and held_steps > 0


def test_a_split_with_an_empty_half_is_refused(script: ModuleType, cache_dir: Path) -> None:
    app = typer.Typer()
    app.command()(script.main)
    args = ["--data", str(bundled_data()), "--source", "codet", "--cache-dir", str(cache_dir)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code != 0
    assert "held half empty" in " ".join(result.output.split())
