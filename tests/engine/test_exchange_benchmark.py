"""benchmarks/exchange_throughput.py runs end to end on a small load: Redis throughput,
the engine's rate it is set against, and what indexing a catch-up costs the engine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentspec.testing.redis_server import NO_REDIS, redis_server_binary

pytest.importorskip("redis", reason="needs redis-py (the redis extra)")
pytestmark = pytest.mark.skipif(redis_server_binary() is None, reason=NO_REDIS)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "exchange_throughput.py"


def test_the_throughput_benchmark_reports_transport_and_indexing() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--outputs", "300", "--tokens", "50", "--peers", "2", "--catch-up", "200"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "300 outputs of 50 tokens, 1 publisher, 2 readers" in out
    sent = float(re.search(r"sent to Redis:\s+(\d+) outputs/s", out).group(1))  # type: ignore[union-attr]
    read = float(re.search(r"read by every reader:\s+(\d+) outputs/s", out).group(1))  # type: ignore[union-attr]
    assert sent > 0 and read > 0
    per_token = float(re.search(r"engine's thread: ([\d.]+) us per token", out).group(1))  # type: ignore[union-attr]
    catch_up_ms = float(re.search(r"200 outputs at once: (\d+) ms", out).group(1))  # type: ignore[union-attr]
    # The catch-up's time is its tokens at the measured rate (rounded to whole ms).
    assert abs(catch_up_ms - per_token * 200 * 50 / 1e3) <= 1.0, out
    assert re.search(r"step budget 10 ms: about \d+ tokens per step", out), out
