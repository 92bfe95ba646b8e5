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
