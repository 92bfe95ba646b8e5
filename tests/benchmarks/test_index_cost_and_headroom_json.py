"""benchmarks/index_cost.py --json and benchmarks/choice_headroom.py --json: the figures
docs/policy.md quotes from benchmarks/results/dev-index-cost.json and
dev-choice-headroom.json, on the bundled slice."""

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

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run(module: ModuleType, args: list[str]) -> str:
    app = typer.Typer()
    app.command()(module.main)
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_index_cost_writes_what_it_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSPEC_CACHE_DIR", str(tmp_path / "cache"))
    script = _script("index_cost")
    out = tmp_path / "cost.json"
    output = _run(script, ["--data", str(bundled_data()), "--limit", "1", "--json", str(out)])
    text = out.read_text()
    doc = json.loads(text)
    assert str(tmp_path) not in text and str(bundled_data().parent) not in text
    settings = doc["settings"]
    assert (settings["data"], settings["source"], settings["limit"]) == (bundled_data().name, "mini_swe_agent", 1)
    assert settings["cpus"] >= 1 and settings["wall_s"] > 0
    assert [row["policy"] for row in doc["index_per_call"]] == script.DEPTHS
    for row in doc["index_per_call"]:
        ratio = row["vllm_suffix_us_per_call"] / row["agentspec_us_per_call"]
        assert row["vllm_suffix_over_agentspec"] == pytest.approx(ratio)
        assert f"1/{ratio:.1f}" in output
    side = doc["prompt_side"]
    assert side["calls"] > 0 and 0 < side["new"] <= side["prompt"]
    assert f"{side['prompt']:.0f} prompt tokens per call, {side['new']:.0f} new to the session" in output


def test_choice_headroom_writes_what_it_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTSPEC_CACHE_DIR", str(tmp_path / "cache"))
    script = _script("choice_headroom")
    out = tmp_path / "headroom.json"
    output = _run(script, ["--data", str(bundled_data()), "--limit", "1", "--source", "tau_bench", "--json", str(out)])
    text = out.read_text()
    doc = json.loads(text)
    assert str(tmp_path) not in text and str(bundled_data().parent) not in text
    assert (doc["settings"]["data"], doc["settings"]["sources"]) == (bundled_data().name, ["tau_bench"])
    row = doc["sources"]["tau_bench"]
    assert set(row["al"]) == set(script.PROPOSERS)
    for proposer in script.PROPOSERS:
        assert row["vs_vllm_suffix"][proposer] == pytest.approx(row["al"][proposer] / row["al"]["vllm-suffix"])
        assert row["vs_agentspec"][proposer] == pytest.approx(row["al"][proposer] / row["al"]["agentspec"])
    assert row["vs_agentspec"]["hindsight-level"] >= 1.0  # the choice in hindsight is never worse
    assert f"tau_bench: vllm-suffix {row['al']['vllm-suffix']:.3f}" in output
