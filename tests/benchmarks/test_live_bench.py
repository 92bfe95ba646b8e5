"""Smoke test of benchmarks/live_bench.py on the real model's shared test servers.

The benchmark itself starts a fresh server per method and run, which is too slow for the
test suite; here its workloads and measurement run in tenants of their own on the servers
the real-model tests already share, small (two sessions of two turns), and the checks are
those the benchmark's table rests on: tokens and steps counted from the stream, vLLM's
counters moved, the step replay of the server's own log equal to the server's counts.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import live_bench
import pytest
from rich.console import Console

from agentspec.replay.config import bundled_data
from agentspec.testing.server import VLLMServer
from agentspec.testing.server_kinds import TEST_INDEX_CONFIG


def _plan(salt: str) -> dict[str, list[live_bench.Session]]:
    spec = live_bench.WorkloadSpec(
        sessions=2, turns=2, max_tokens=24, window=768, data=bundled_data(), salt=salt, samples=2
    )

    def count(text: str) -> int:  # about 3 characters a token: enough to window for a smoke test
        return len(text) // 3 + 1

    return {name: live_bench.workload_sessions(name, spec, salt, count) for name in live_bench.WORKLOADS}


@pytest.mark.timeout(600)
def test_agentspec_workloads_measured_and_its_steps_replayed(agentspec_real_server: VLLMServer) -> None:
    salt = f"live-{uuid.uuid4().hex[:8]}"
    assert agentspec_real_server.step_log_dir is not None
    measured = live_bench.serve_workloads(
        agentspec_real_server.url,
        "agentspec",
        _plan(salt),
        concurrency=2,
        step_log_dir=agentspec_real_server.step_log_dir,
        salt=salt,
        index_config=TEST_INDEX_CONFIG,
    )
    assert set(measured) == {"dev", "loop", "rl"}
    for name, m in measured.items():
        assert m.calls == 4, name
        assert 0 < m.live_steps <= m.output_tokens <= 4 * 24, name
        assert m.draft_tokens > 0 and m.replay_steps > 0, name
        # The server's own counts are what its logged steps give when redone (sampled too).
        assert m.steps_equal_server is True, (name, m)
    # The repair loops quote the model's own answers: something was drafted and accepted.
    assert measured["loop"].server_accepted and measured["loop"].al > 1.0

    out = io.StringIO()
    summary = live_bench.report({w: {"agentspec": [m]} for w, m in measured.items()}, Console(file=out, width=150))
    assert summary["loop"]["agentspec"]["steps_equal_server"] is True
    assert "workload loop" in out.getvalue() and "agentspec" in out.getvalue()


def test_plain_server_has_no_drafts(plain_real_server: VLLMServer, tmp_path: Path) -> None:
    salt = f"live-{uuid.uuid4().hex[:8]}"
    plan = {"loop": _plan(salt)["loop"]}
    transcripts = tmp_path / "calls.jsonl"
    (m,) = live_bench.serve_workloads(
        plain_real_server.url, "none", plan, concurrency=2, step_log_dir=None, transcripts=transcripts
    ).values()
    assert m.output_tokens > 0 and m.draft_tokens == 0
    # One token a step without speculation; the API server may merge a step or two into one
    # chunk when it falls behind the engine, never split one.
    assert 0.8 * m.output_tokens <= m.live_steps <= m.output_tokens
    assert m.steps_equal_server is None

    # The calls as trajectories (train-drafter's input): each session's turns in order, the
    # second turn's messages quoting the first turn's answer.
    from agentspec.replay.trajectories import load_trajectories

    (trajectories,) = load_trajectories(transcripts).values()
    assert len(trajectories) == 2 and all(len(t.turns) == 2 for t in trajectories)
    for t in trajectories:
        first, second = t.turns
        assert first.output and any(msg.content == first.output for msg in second.messages), t


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--servers", "none,eagle"], "unknown servers: eagle"),
        (["--workloads", "dev,nope"], "unknown workloads: nope"),
        (["--data", "no-such-file.jsonl"], "no such file"),
        (["--servers", "none,hybrid"], "--drafter: servers eagle3, hybrid, hybrid-arctic need a head folder"),
    ],
)
def test_bad_options_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as info:
        live_bench.main([*argv, "--cache-dir", str(tmp_path)])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("method", "version", "replayed_as"),
    [
        ("vllm-suffix", "0.32.0+cpu", "vllm-suffix-0.32"),
        ("vllm-suffix", "0.34.0+cpu", "vllm-suffix"),
        ("agentspec", "0.34.0+cpu", "agentspec"),
        ("vllm-ngram", "0.32.0+cpu", "vllm-ngram"),
    ],
)
def test_the_replay_drafts_as_the_servers_vllm_does(method: str, version: str, replayed_as: str) -> None:
    assert live_bench.replay_proposer(method, version) == replayed_as
