"""The test-server pool: bounded starts, deadlines from each launch, servers stopped after
their last user, and a start that fails failing only its own users, with one line.

The pool's scheduling is tested on light HTTP servers (a Python process per "server" that
answers ``/health`` after a delay, or writes a vLLM-like error and exits), so that each
test takes seconds; the last test runs a real vLLM server that cannot start, inside a
pytest run of its own.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentspec.testing.server import ServerStartError, VLLMServer, free_port, start_failure_reason
from agentspec.testing.server_kinds import KindContext, ServerKind
from agentspec.testing.server_pool import ServerPool, core_slices

# Records when it started and when it began to answer, then serves /health (or fails).
FAKE_SERVER = r"""
import http.server, json, sys, time
port, delay, failure = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
print(json.dumps({"launched": time.time()}), flush=True)
time.sleep(delay)
if failure:
    print(failure, flush=True)
    sys.exit(1)
print(json.dumps({"ready": time.time()}), flush=True)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""

KV_ERROR = (
    "ValueError: To serve at least one request with the models's max seq len (2048), (0.01 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (0.00 GiB)."
)


@dataclass(frozen=True)
class LightKind(ServerKind):
    """A server kind whose process is :data:`FAKE_SERVER`, not vLLM."""

    delay_s: float = 0.3
    failure: str = ""

    def launch(self, context: KindContext, *, extra_env: dict[str, str] | None = None) -> VLLMServer:
        port = free_port()
        log_path = context.log_dir / f"{self.name}-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", FAKE_SERVER, str(port), str(self.delay_s), self.failure],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return VLLMServer(proc, port, log_path, None, name=self.name)


def light(name: str, **kwargs: object) -> LightKind:
    return LightKind(name, f"light server {name}", None, **kwargs)  # type: ignore[arg-type]


def events(server: VLLMServer) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in server.log_path.read_text().splitlines():
        if line.startswith("{"):
            found.update(json.loads(line))
    return found


@pytest.fixture
def context(tmp_path: Path) -> KindContext:
    return KindContext(tmp_path, tmp_path, tmp_path, redis_url=lambda: "redis://unused")


@dataclass(frozen=True)
class UnbuildableKind(LightKind):
    """A kind whose launch raises before any process starts (its model cannot be built)."""

    def launch(self, context: KindContext, *, extra_env: dict[str, str] | None = None) -> VLLMServer:
        raise RuntimeError("downloading the model failed\nno network: PyPI unreachable")


def test_a_kind_that_cannot_launch_fails_only_its_users_with_one_line(context: KindContext) -> None:
    broken, fine = UnbuildableKind("broken", "a kind whose model cannot be built", None), light("fine")
    # fine's user runs first, and the pool starts broken ahead of its test (prefetch):
    # the failure must not escape there, only at broken's own users.
    pool = ServerPool(context, [(fine,), (broken,), (broken,)], max_starting=1)
    try:
        pool.get(fine)
        pool.finished(0)
        for _ in range(2):  # every user of it, not only the first
            with pytest.raises(ServerStartError) as failure:
                pool.get(broken)
            assert str(failure.value) == "broken server did not start: no network: PyPI unreachable"
    finally:
        pool.close()


def test_starts_are_bounded_and_each_deadline_counts_from_its_own_launch(context: KindContext) -> None:
    kinds = [light(n, delay_s=1.0) for n in "abc"]
    # Each start takes 1 s, the deadline is 1.8 s: three at once would pass only if each
    # deadline counted from its own launch, one at a time.
    pool = ServerPool(context, [(k,) for k in kinds], max_starting=1, start_timeout_s=1.8)
    try:
        servers = []
        for index, kind in enumerate(kinds):
            servers.append(pool.get(kind))
            pool.finished(index)
        spans = sorted((events(s)["launched"], events(s)["ready"]) for s in servers)
        for (_, ready), (launched, _) in zip(spans, spans[1:], strict=False):
            assert launched >= ready - 0.05, spans  # never two starting at once
    finally:
        pool.close()


def test_the_next_kind_starts_while_tests_run_and_servers_stop_after_their_last_user(context: KindContext) -> None:
    a, b, c = light("a"), light("b"), light("c")
    pool = ServerPool(context, [(a,), (a, b), (b,), (c,)], max_starting=1)
    try:
        sa = pool.get(a)
        assert pool.running == ["a", "b"]  # b is launched ahead of its first test
        pool.finished(0)
        sb = pool.get(b)
        pool.get(a)
        pool.finished(1)
        assert sa.proc.poll() is not None and sb.proc.poll() is None  # a's last user was test 1
        assert set(pool.running) == {"b", "c"}
        pool.finished(2)
        assert sb.proc.poll() is not None and pool.running == ["c"]
    finally:
        pool.close()
    assert pool.running == []


def test_a_failed_start_fails_its_users_with_one_line_and_leaves_other_kinds_alone(context: KindContext) -> None:
    broken, good = light("broken", failure=KV_ERROR), light("good")
    pool = ServerPool(context, [(broken,), (broken,), (good,)], max_starting=1)
    try:
        with pytest.raises(ServerStartError) as first:
            pool.get(broken)
        message = str(first.value)
        assert "\n" not in message
        assert message.startswith("broken server did not start: KV cache memory ran out")
        log = Path(message.rsplit("log: ", 1)[1])
        assert log.exists() and KV_ERROR in log.read_text()
        started = time.monotonic()
        with pytest.raises(ServerStartError) as second:
            pool.get(broken)
        assert second.value is first.value and time.monotonic() - started < 0.5  # not started again
        assert len(list(context.log_dir.glob("broken-*.log"))) == 1
        assert pool.get(good).proc.poll() is None
    finally:
        pool.close()


def test_a_start_that_runs_out_of_time_says_so(context: KindContext) -> None:
    slow = light("slow", delay_s=30)
    pool = ServerPool(context, [(slow,)], start_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(ServerStartError, match=r"^slow server did not start: time ran out: not healthy 1 s after"):
        pool.get(slow)
    assert time.monotonic() - started < 10
    pool.close()


def test_a_disposable_server_killed_by_a_test_is_started_afresh(context: KindContext) -> None:
    spare = LightKind("spare", "killed by tests", None, disposable=True)
    shared = light("shared")
    pool = ServerPool(context, [(spare, shared), (spare, shared)])
    try:
        first = pool.get(spare)
        kept = pool.get(shared)
        first.kill()
        second = pool.get(spare)
        assert second is not first and second.proc.poll() is None
        kept.kill()  # a shared server dying under its tests is a failure, not restarted
        with pytest.raises(ServerStartError, match="shared server exited with -9 during the tests"):
            pool.get(shared)
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("returncode", "log", "reason"),
    [
        (1, KV_ERROR, "KV cache memory ran out"),
        (-9, "INFO loading weights\n", "host memory ran out (killed by SIGKILL"),
        (1, "RuntimeError: std::bad_alloc\n", "host memory ran out (RuntimeError: std::bad_alloc)"),
        (1, "OSError: [Errno 98] Address already in use\n", "its port was taken"),
        (None, "INFO loading weights\n", "time ran out: not healthy 300 s after its launch"),
        (2, "ValueError: unknown option --frobnicate\n", "exited with 2 (ValueError: unknown option --frobnicate)"),
    ],
)
def test_the_failure_line_names_what_ran_out(returncode: int | None, log: str, reason: str) -> None:
    assert start_failure_reason(returncode, log, 300.0).startswith(reason)


def test_servers_get_cores_of_their_own_in_turn() -> None:
    assert core_slices([0, 1]) == ["0", "1"]
    assert core_slices(list(range(16))) == ["0,1,2,3", "4,5,6,7", "8,9,10,11", "12,13,14,15"]
    assert core_slices([3]) == ["3"]


BROKEN_CONFTEST = """
from agentspec.testing.pytest_plugin import server_fixture
from agentspec.testing.server_kinds import ServerKind

pytest_plugins = ["agentspec.testing.pytest_plugin"]

# 4 KiB of KV cache: not even one sequence fits, vLLM refuses to start.
broken_server = server_fixture(ServerKind("broken", "cannot start", None, kv_cache_bytes=4096))
"""

BROKEN_TESTS = """
def test_first_user(broken_server):
    pass

def test_second_user(broken_server):
    pass

def test_without_a_server():
    assert 1 + 1 == 2
"""


@pytest.mark.server
def test_a_real_server_that_cannot_start_fails_its_tests_with_one_line(
    pytester: pytest.Pytester, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not importorskip: pytester unloads what a test imports, and vLLM half-unloaded breaks
    # the session's own server tests.
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    monkeypatch.setenv("AGENTSPEC_TINY_MODEL_DIR", str(tiny_model_dir.parent))
    pytester.makeconftest(BROKEN_CONFTEST)
    pytester.makepyfile(test_broken=BROKEN_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1, errors=2)
    # (The short summary's copies are cut to the terminal's width: the full lines name the log.)
    lines = [line for line in result.outlines if "broken server did not start" in line and "log: " in line]
    # One line per failing test (the error and the short summary), naming the resource and the log.
    assert lines and all("KV cache memory ran out" in line and "log: " in line for line in lines), result.outlines
    logs = {line.rsplit("log: ", 1)[1] for line in lines}
    assert len(logs) == 1  # started once; the second user got the same failure at once
    assert "Traceback" not in result.stdout.str()
