"""``agentspec bench --cost-profile``: the replay prices a server's machine from the step
cost that server measured (agentspec.draft_budget.step_cost): its cost model becomes that
machine's, agentspec's drafts are cut where that server's cost budget cuts them, and the
table gives one request's tokens/s on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from agentspec.draft_budget.step_cost import StepCostProfile
from agentspec.replay.cli import bench

#: A CPU's curve (a verified token about as dear as a step) and a GPU's (tokens almost free).
CPU = StepCostProfile(fixed_s=0.004, per_request_s=0.001, per_token_s=0.004, steps=500)
GPU = StepCostProfile(fixed_s=0.010, per_request_s=0.0001, per_token_s=0.000005, steps=500)


def _bench(tmp_path: Path, *extra: str) -> tuple[CliRunner, dict]:
    app = typer.Typer()
    app.command()(bench)
    app.command()(lambda: None)
    out = tmp_path / f"r{len(list(tmp_path.glob('r*.json')))}.json"
    args = ["bench", "--cache-dir", str(tmp_path / "cache"), "--quiet", "--sources", "codet", "--limit", "2"]
    result = CliRunner().invoke(
        app, [*args, "--proposers", "vllm-suffix,agentspec", "--json", str(out), *extra], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


def _record(data: dict, proposer: str) -> dict:
    return next(r for r in data["records"] if r["proposer"] == proposer and r["source"] == "all")


def test_a_servers_profile_prices_the_replay(tmp_path: Path) -> None:
    cpu_path, gpu_path = tmp_path / "cpu.json", tmp_path / "gpu.json"
    CPU.write(cpu_path)
    GPU.write(gpu_path)
    plain_out, plain = _bench(tmp_path)
    cpu_out, on_cpu = _bench(tmp_path, "--cost-profile", str(cpu_path))
    _, on_gpu = _bench(tmp_path, "--cost-profile", str(gpu_path))

    cost = on_cpu["settings"]["cost"]
    assert cost["source"] == "profile" and plain["settings"]["cost"]["source"] == "assumed"
    assert cost["step_ms"] == pytest.approx(9.0) and cost["draft_token_ms"] == pytest.approx(4.0)
    assert "tok/s" in cpu_out.output and "tok/s" not in plain_out.output
    # The CPU's price cuts agentspec's drafts; the GPU's, nearly free, leaves them as uncut.
    drafted = {name: _record(d, "agentspec")["drafted_tokens"] for name, d in (("plain", plain), ("cpu", on_cpu))}
    assert drafted["cpu"] < drafted["plain"]
    assert _record(on_gpu, "agentspec")["drafted_tokens"] == drafted["plain"]
    # vLLM's suffix method is not agentspec's to cut: the same drafts, priced on each machine.
    assert _record(on_cpu, "vllm-suffix")["drafted_tokens"] == _record(plain, "vllm-suffix")["drafted_tokens"]
    # In lockstep, four requests share each step: the fixed cost is divided among them.
    _, batched = _bench(tmp_path, "--cost-profile", str(cpu_path), "--lockstep", "--concurrency", "4")
    assert batched["settings"]["cost"]["batch"] == 4
    assert batched["settings"]["cost"]["step_ms"] == pytest.approx(1.0 + 1.0 + 4.0)
    suffix = _record(batched, "vllm-suffix")
    assert suffix["est_tokens_per_s"] > 3 * _record(on_cpu, "vllm-suffix")["est_tokens_per_s"]
    for data in (on_cpu, on_gpu):
        suffix = _record(data, "vllm-suffix")
        step_ms, token_ms = data["settings"]["cost"]["step_ms"], data["settings"]["cost"]["draft_token_ms"]
        busy_s = (suffix["steps"] * step_ms + suffix["drafted_tokens"] * token_ms) / 1e3
        # Its tokens/s: output over the steps' time and its own drafting time.
        assert 0 < suffix["est_tokens_per_s"] <= suffix["output_tokens"] / busy_s


def test_a_bad_profile_is_refused_naming_the_file(tmp_path: Path) -> None:
    app = typer.Typer()
    app.command()(bench)
    app.command()(lambda: None)
    path = tmp_path / "cost.json"
    path.write_text('{"fixed_s": 0.01, "per_tokens_s": 0.1}')
    result = CliRunner().invoke(app, ["bench", "--cost-profile", str(path), "--quiet"])
    assert result.exit_code == 2
    assert f"cost profile {path}: per_tokens_s" in result.output
