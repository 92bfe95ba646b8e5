"""benchmarks/policy_sweep.py --json: the sweep's figures as JSON (docs/policy.md's sweep
table is made from such a file), on the bundled slice."""

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

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "policy_sweep.py"
POLICIES = ({}, {"min_token_prob": 0.3})


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("policy_sweep", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["policy_sweep"] = module
    spec.loader.exec_module(module)
    return module


def test_the_json_holds_what_the_sweep_prints(
    script: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTSPEC_CACHE_DIR", str(tmp_path / "cache"))
    app = typer.Typer()
    app.command()(script.main)
    out = tmp_path / "sweep.json"
    args = ["--data", str(bundled_data()), "--sources", "tau_bench,codet", "--limit", "2", "--json", str(out)]
    for policy in POLICIES:
        args += ["--policy", json.dumps(policy)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    text = out.read_text()
    doc = json.loads(text)
    assert str(tmp_path) not in text and str(bundled_data().parent) not in text

    settings = doc["settings"]
    assert settings["data"] == bundled_data().name
    assert (settings["sources"], settings["limit"]) == (["tau_bench", "codet"], 2)
    assert settings["defaults"]["min_token_prob"] == pytest.approx(0.2)
    base = doc["baseline"]["records"]
    assert list(base) == ["tau_bench", "codet", "all"]
    assert [row["policy"] for row in doc["policies"]] == list(POLICIES)

    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.startswith("│")}
    for row, label in zip(doc["policies"], ("defaults", "min_token_prob=0.3"), strict=True):
        ours = row["records"]
        for source in ("tau_bench", "codet", "all"):
            assert row["al_ratio"][source] == pytest.approx(ours[source]["al"] / base[source]["al"])
            assert row["acceptance_ratio"][source] == pytest.approx(
                ours[source]["acceptance_rate"] / base[source]["acceptance_rate"]
            )
        assert row["lowest_al_ratio"] == min(row["al_ratio"]["tau_bench"], row["al_ratio"]["codet"])
        cells = [c.strip() for c in lines[label].split("│")[2:-1]]
        assert cells == [
            f"{row['al_ratio']['all']:.3f}",
            f"{row['lowest_al_ratio']:.3f}",
            *(f"{row['acceptance_ratio'][s]:.2f}" for s in ("tau_bench", "codet", "all")),
        ]


def test_the_default_sweep_holds_every_row_of_the_docs_table(script: ModuleType) -> None:
    assert script.POLICIES[1] == {}  # the defaults, in bold on the page
    assert {"max_depth": 40, "max_match_tokens": 20} in script.POLICIES
    assert len({json.dumps(p, sort_keys=True) for p in script.POLICIES}) == len(script.POLICIES)
