"""benchmarks/chooser_fit.py --json: the figures it prints, written as JSON (docs/policy.md's
figures on the fitted chooser are made from such a file), on the bundled slice."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import typer
from typer.testing import CliRunner

from agentspec.replay.config import bundled_data

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


def test_the_json_holds_what_the_script_prints(script: ModuleType, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(script.main)
    out = tmp_path / "fit.json"
    args = ["--data", str(bundled_data()), "--limit", "6", "--cache-dir", str(tmp_path / "cache"), "--json", str(out)]
    for source in SOURCES:
        args += ["--source", source]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    printed = " ".join(result.output.split())
    doc = json.loads(out.read_text())

    settings = doc["settings"]
    assert settings["data"] == bundled_data().name  # the file's name, not where it lies
    assert str(tmp_path) not in out.read_text() and str(bundled_data().parent) not in out.read_text()
    assert (settings["sources"], settings["limit"], settings["record_every"]) == (list(SOURCES), 6, 4)
    assert all(sum(halves) <= 6 for halves in settings["trajectories"].values())

    fit, held = doc["fit"], doc["held"]
    assert f"fit: {fit['steps']:,} steps ({fit['token_events']:,} token events)" in printed
    assert f"held: {held['steps']:,} steps ({held['token_events']:,})" in printed
    assert f"log-loss fit {fit['log_loss']:.4f}, held {held['log_loss']:.4f}" in printed
    assert list(fit["weights"]) == list(script.FEATURES)
    accepted = held["accepted"]
    assert f"calibrated score {accepted['calibrated_score']:,.0f}; fitted model {accepted['fitted_model']:,.0f}" in (
        printed
    )
    assert accepted["hindsight"] >= max(accepted["calibrated_score"], accepted["fitted_model"])

    replay = doc["replay"]
    assert list(replay) == [*SOURCES, "all"]
    for proposer in ("vllm-suffix", "agentspec", "agentspec-fitted"):
        total = replay["all"][proposer]
        for field in ("output_tokens", "steps", "accepted_tokens", "drafted_tokens"):
            assert total[field] == sum(replay[s][proposer][field] for s in SOURCES)
        assert total["al"] == pytest.approx(total["output_tokens"] / total["steps"])
    suffix, ours = replay["all"]["vllm-suffix"], replay["all"]["agentspec"]
    assert f"│ all │ │ {suffix['al']:.3f} │ {ours['al'] / suffix['al']:.3f} │" in " ".join(result.output.split())
