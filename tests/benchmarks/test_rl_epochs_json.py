"""benchmarks/rl_epochs.py --json: epoch 2's AL with the first epoch's outputs kept or
retired, as JSON, on the bundled slice."""

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

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rl_epochs.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rl_epochs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_epochs"] = module
    spec.loader.exec_module(module)
    return module


def test_the_json_holds_what_the_table_prints(script: ModuleType, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(script.main)
    out = tmp_path / "epochs.json"
    args = ["--data", str(bundled_data()), "--sources", "codet", "--limit", "2"]
    args += ["--cache-dir", str(tmp_path / "cache"), "--json", str(out)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    text = out.read_text()
    assert str(tmp_path) not in text and str(bundled_data().parent) not in text
    doc = json.loads(text)
    settings = doc["settings"]
    assert (settings["data"], settings["sources"], settings["limit"]) == (bundled_data().name, ["codet"], 2)
    codet = doc["sources"]["codet"]
    al = codet["al"]
    assert codet["kept_over_retired"] == pytest.approx(al["agentspec, kept"] / al["agentspec, retired"])
    assert al["agentspec, kept"] >= al["agentspec, retired"]  # the old outputs are exactly right here
    row = next(line for line in result.output.splitlines() if "│ codet" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == [
        "codet",
        str(codet["groups"]),
        f"{al['vllm-suffix']:.3f}",
        f"{al['agentspec, kept']:.3f}",
        f"{al['agentspec, retired']:.3f}",
        f"{codet['kept_over_retired']:.2f}x",
    ]


def test_a_run_of_some_arms_gives_what_a_run_of_all_does(script: ModuleType, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(script.main)
    common = ["--data", str(bundled_data()), "--sources", "codet", "--limit", "2"]
    common += ["--cache-dir", str(tmp_path / "cache")]
    docs = {}
    for arms in ("vllm-suffix,kept,retired", "kept", "vllm-suffix,retired"):
        out = tmp_path / f"{arms}.json"
        result = CliRunner().invoke(app, [*common, "--arms", arms, "--json", str(out)], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output + repr(result.exception)
        docs[arms] = json.loads(out.read_text())["sources"]["codet"]
    every = docs["vllm-suffix,kept,retired"]
    assert list(every["al"]) == list(script.ARMS.values())
    assert docs["kept"]["al"] == {"agentspec, kept": every["al"]["agentspec, kept"]}
    assert docs["vllm-suffix,retired"]["al"] == {arm: every["al"][arm] for arm in ("vllm-suffix", "agentspec, retired")}
    assert "kept_over_retired" not in docs["kept"] and "kept_over_retired" not in docs["vllm-suffix,retired"]
    assert CliRunner().invoke(app, [*common, "--arms", "ngram"]).exit_code != 0
