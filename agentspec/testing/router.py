"""vLLM's router (PyPI ``vllm-router``) in front of test servers, started and stopped for tests.

The tests of integrations that run behind a router use the real one, not a stand-in::

    with VLLMRouter.start([a.url, b.url]) as router:      # consistent hashing
        httpx.post(router.url + "/v1/chat/completions", headers={"X-Session-ID": "task-7"}, ...)

The binary comes with the ``vllm-router`` wheel; it is looked up next to this interpreter,
then on ``PATH``. Health checks run every second and one failure marks a worker down, so a
killed backend leaves the hash ring within about a second (the router's defaults are slower).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from agentspec.testing.server import free_port

__all__ = ["ROUTER_BINARY", "VLLMRouter", "find_router"]

ROUTER_BINARY = "vllm-router"

#: Fast failure detection for tests; everything else is the router's default.
TEST_ROUTER_ARGS: tuple[str, ...] = (
    "--health-check-interval-secs", "1",
    "--health-failure-threshold", "1",
    "--health-success-threshold", "1",
    "--health-check-timeout-secs", "2",
    "--log-level", "warning",
)  # fmt: skip


def find_router() -> str | None:
    """The ``vllm-router`` executable: beside this interpreter, else on ``PATH``."""
    beside = Path(sys.executable).parent / ROUTER_BINARY
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(ROUTER_BINARY)


@dataclass
class VLLMRouter:
    """A ``vllm-router`` process; use :meth:`start`."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    workers: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        worker_urls: Sequence[str],
        *,
        policy: str = "consistent_hash",
        extra_args: Sequence[str] = (),
        log_dir: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
    ) -> VLLMRouter:
        """Start the router over ``worker_urls`` and wait until it serves ``/v1/models``."""
        binary = find_router()
        if binary is None:
            raise FileNotFoundError(f"{ROUTER_BINARY} not found: pip install vllm-router")
        port = free_port()
        log_root = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="agentspec-router-"))
        log_root.mkdir(parents=True, exist_ok=True)
        log_path = log_root / f"vllm-router-{port}.log"
        cmd = [
            binary,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--policy", policy,
            "--worker-urls", *worker_urls,
            # Its metrics listener has a fixed default port: two routers would collide.
            "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()),
            *TEST_ROUTER_ARGS,
            *extra_args,
        ]  # fmt: skip
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        router = cls(proc, port, log_path, tuple(worker_urls))
        router._wait_ready(timeout)
        return router

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"vllm-router not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
