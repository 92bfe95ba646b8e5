"""A real ``redis-server`` for tests: on a free loopback port, without persistence, in a
folder of its own; it can be stopped and started again on the same port (a Redis outage,
and a restart that lost the data)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self

__all__ = ["NO_REDIS", "RedisServer", "redis_server_binary"]

NO_REDIS = "redis-server is not installed (Debian: apt-get install redis-server; scripts/test.sh installs it)"


def redis_server_binary() -> str | None:
    """The ``redis-server`` on the PATH, or None."""
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process; :meth:`start` and :meth:`stop` may be repeated."""

    def __init__(self, port: int | None = None) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError(NO_REDIS)
        self.binary = binary
        self.port = port or _free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="agentspec-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> Self:
        """Start it (empty: nothing is kept between runs) and wait until it answers."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        log = open(self.folder / "redis.log", "ab")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited ({self.proc.returncode}): see {self.folder / 'redis.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout:.0f} s")

    def stop(self) -> None:
        """Kill it (an outage: clients see their connections drop)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
