"""examples/gpu_check.py, the check users run on their GPU, run here against the tiny CPU
test servers: its GPU-only checks (soak, speed) skip, the others must pass; pointed at a
server that is not agentspec's, it fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(agentspec_url: str, plain_url: str) -> subprocess.CompletedProcess[str]:
    args = ["--agentspec-url", agentspec_url, "--plain-url", plain_url, "--max-tokens", "48", "--soak-s", "5"]
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_the_first_divergence_is_named() -> None:
    check = _load()
    same = [[check.Turn("p", [1, 2, 3], "abc")]]
    assert check.first_divergence(same, same) is None
    other = [[check.Turn("p", [1, 5, 3], "aec")]]
    assert check.first_divergence(same, other) == "task 0, turn 1, output token 1 ([2] vs [5])"
    shorter = [[check.Turn("p", [1, 2], "ab")]]
    assert check.first_divergence(same, shorter) == "task 0, turn 1, output token 2 ([3] vs [])"


@pytest.mark.server
def test_the_check_passes_on_agentspec_and_skips_what_needs_a_gpu(agentspec_server, plain_server) -> None:
    result = _run(agentspec_server.url, plain_server.url)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split(":")[0] for line in lines] == [
        "PASS  in the loop",
        "PASS  greedy identity",
        "PASS  drafting",
        "SKIP  soak",
        "SKIP  speed",
    ]
    assert "no CUDA device" in lines[3]


@pytest.mark.server
def test_the_check_fails_on_a_server_without_agentspec(plain_server) -> None:
    result = _run(plain_server.url, plain_server.url)
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert [line.split(":")[0] for line in failed] == ["FAIL  in the loop"]
