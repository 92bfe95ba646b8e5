"""Start a real vLLM OpenAI server on the tiny model for tests, and stop it again.

Used by agentspec's server tests and by integrations' tests::

    with VLLMServer.start(model_dir, log_dir=tmp) as server:   # agentspec serve
        httpx.post(server.url + "/v1/completions", json={...})

``agentspec=False`` starts plain vLLM (the plugin stays inert without its env var), with
``extra_args`` e.g. ``["--speculative-config", '{"method": "suffix"}']`` for vLLM's own
suffix decoding. The server runs in its own process group, so stopping it stops vLLM's
engine and worker processes too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from agentspec.engine.config import EngineSettings
from agentspec.engine.serve import build_command, build_env

#: vLLM options every test server gets: CPU-friendly and deterministic, plus what the
#: tool-calling tests of the client and integrations need.
TEST_SERVER_ARGS: tuple[str, ...] = (
    "--dtype", "float32",
    "--enforce-eager",
    "--max-model-len", "2048",
    "--max-num-seqs", "32",
    "--served-model-name", "tiny",
    "--enable-auto-tool-choice",
    "--tool-call-parser", "hermes",
    "--disable-uvicorn-access-log",
)  # fmt: skip

SERVED_MODEL_NAME = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class VLLMServer:
    """A vLLM server process; use :meth:`start` (or :meth:`launch` + :meth:`wait_ready`)."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    state_dir: Path | None
    model: str = SERVED_MODEL_NAME
    #: Where the drafting workers log their steps (EngineSettings.step_log_dir), if they do.
    step_log_dir: Path | None = None
    _owned_dirs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def launch(
        cls,
        model_dir: str | os.PathLike[str],
        *,
        agentspec: bool = True,
        settings: EngineSettings | None = None,
        extra_args: list[str] | tuple[str, ...] = (),
        log_dir: str | os.PathLike[str] | None = None,
        kv_cache_gib: int = 1,
        python: str | None = None,
    ) -> VLLMServer:
        """Start the process and return at once; call :meth:`wait_ready` before use.

        ``python`` is the interpreter that runs the server (one with ``vllm-agentspec[cpu]``);
        by default this one.
        """
        port = free_port()
        owned: list[Path] = []
        log_root = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="agentspec-server-"))
        if not log_dir:
            owned.append(log_root)
        log_root.mkdir(parents=True, exist_ok=True)
        args = [*TEST_SERVER_ARGS, "--port", str(port), "--host", "127.0.0.1", *extra_args]
        state_dir: Path | None = None
        if agentspec:
            state_dir = Path(tempfile.mkdtemp(prefix="agentspec-state-"))
            owned.append(state_dir)
            settings = (settings or EngineSettings()).model_copy(update={"state_dir": str(state_dir)})
            cmd = build_command(str(model_dir), args, python=python, drafter=settings.drafter)
            env = build_env(settings)
        else:
            cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), *args]
            env = dict(os.environ)
            env.pop("AGENTSPEC_ENGINE_CONFIG", None)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        log_path = log_root / f"vllm-{'agentspec' if agentspec else 'plain'}-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        step_log_dir = Path(settings.step_log_dir) if settings is not None and settings.step_log_dir else None
        return cls(proc, port, log_path, state_dir, step_log_dir=step_log_dir, _owned_dirs=owned)

    @classmethod
    def start(cls, model_dir: str | os.PathLike[str], *, timeout: float = 240.0, **kwargs: object) -> VLLMServer:
        """Launch and wait until ``/health`` answers 200."""
        server = cls.launch(model_dir, **kwargs)  # type: ignore[arg-type]
        server.wait_ready(timeout)
        return server

    def wait_ready(self, timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """Kill vLLM at once (SIGKILL to the whole process group), as a crash would."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def stop(self, grace: float = 15.0) -> None:
        """Stop vLLM and all its processes (the whole process group)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        # Children that outlived the leader (same group) get the same treatment.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for d in self._owned_dirs:
            shutil.rmtree(d, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
