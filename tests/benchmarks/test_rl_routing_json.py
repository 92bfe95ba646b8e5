"""benchmarks/rl_routing.py --json: pinned against spread groups as JSON (docs/rl.md's table
of the first groups is made from such a file), on the bundled slice."""

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

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "rl_routing.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rl_routing", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_routing"] = module
    spec.loader.exec_module(module)
    return module


def test_the_json_holds_what_the_table_prints(script: ModuleType, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(script.main)
    out = tmp_path / "routing.json"
    args = ["--data", str(bundled_data()), "--sources", "codet", "--limit", "2", "--replicas", "2"]
    args += ["--cache-dir", str(tmp_path / "cache"), "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    text = out.read_text()
    assert str(tmp_path) not in text and str(bundled_data().parent) not in text
    doc = json.loads(text)
    assert doc["settings"] | {"wall_s": 0} == {
        "data": bundled_data().name,
        "sources": ["codet"],
        "replicas": 2,
        "exchange": False,
        "limit": 2,
        "concurrency": script.CONCURRENCY,
        "wall_s": 0,
    }
    codet = doc["sources"]["codet"]
    assert list(codet["al"]) == list(script.PROPOSERS)
    for label, al in codet["al"].items():
        counts = codet["counts"][label]
        assert al == pytest.approx(counts["output_tokens"] / counts["steps"])
    ratio = codet["agentspec_client_over_spread"]
    assert ratio == pytest.approx(codet["al"]["agentspec, client"] / codet["al"]["agentspec, spread"])
    row = next(line for line in result.output.splitlines() if "│ codet" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == [
        "codet",
        str(codet["trajectories"]),
        *(f"{codet['al'][label]:.3f}" for label in script.PROPOSERS),
        f"{ratio:.2f}x",
        f"{codet['suffix_client_over_spread']:.2f}x",
    ]


def test_a_run_of_one_proposers_arms_gives_what_a_run_of_both_does(script: ModuleType, tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(script.main)
    common = ["--data", str(bundled_data()), "--sources", "codet", "--limit", "2", "--replicas", "2"]
    common += ["--cache-dir", str(tmp_path / "cache")]
    docs = {}
    for proposers in ("agentspec,vllm-suffix", "agentspec", "vllm-suffix"):
        out = tmp_path / f"{proposers}.json"
        result = CliRunner().invoke(app, [*common, "--proposers", proposers, "--json", str(out)])
        assert result.exit_code == 0, result.output + repr(result.exception)
        docs[proposers] = json.loads(out.read_text())["sources"]["codet"]
    both = docs["agentspec,vllm-suffix"]
    for proposer, ratio in script.RATIOS.items():
        part = docs[proposer]
        assert list(part["al"]) == [f"{proposer}, client", f"{proposer}, spread"]
        assert all(
            part["al"][arm] == both["al"][arm] and part["counts"][arm] == both["counts"][arm] for arm in part["al"]
        )
        assert part[ratio] == both[ratio]
        assert not (set(script.RATIOS.values()) - {ratio}) & set(part)  # nor the other's ratio
    refused = CliRunner().invoke(app, [*common, "--proposers", "ngram"])
    assert refused.exit_code != 0
