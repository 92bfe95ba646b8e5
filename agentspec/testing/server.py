"""Start a real vLLM OpenAI server on the tiny model for tests, and stop it again.

Used by agentspec's server tests and by integrations' tests::

    with VLLMServer.start(model_dir, log_dir=tmp) as server:   # agentspec serve
        httpx.post(server.url + "/v1/completions", json={...})

``agentspec=False`` starts plain vLLM (the plugin stays inert without its env var), with
``extra_args`` e.g. ``["--speculative-config", '{"method": "suffix"}']`` for vLLM's own
suffix decoding. The server runs in its own process group, so stopping it stops vLLM's
engine and worker processes too.

A server that does not come up raises :class:`ServerStartError`, one line naming the
server, what ran out (memory, KV cache, time) and its log file.
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

from agentspec.engine.launcher.serve import build_command, build_env, installed_vllm_version, model_runner_for
from agentspec.engine.settings import EngineSettings

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

#: KV cache of a test server: 64k tokens of the tiny model (4 KiB per token in fp32), all
#: 32 sequences at full length. vLLM's ``VLLM_CPU_KVCACHE_SPACE`` takes whole GiB only.
DEFAULT_KV_CACHE_BYTES = 256 * 2**20


class ServerStartError(RuntimeError):
    """A test server did not become healthy; the message is one line."""


def _first_line_with(log: str, needles: tuple[str, ...], *, from_needle: bool = False) -> str | None:
    """The last line of ``log`` holding one of ``needles`` (from that needle on, if asked:
    vLLM's log prefix says nothing here), shortened."""
    for line in reversed(log.splitlines()):
        for needle in needles:
            at = line.find(needle)
            if at >= 0:
                text = line[at if from_needle else 0 :].strip()
                return text if len(text) <= 120 else text[:117] + "..."
    return None


def start_failure_reason(returncode: int | None, log: str, waited_s: float) -> str:
    """What stopped a server from starting, from its exit status and log, in a few words.

    ``returncode`` is None when the server was still running when its time ran out.
    """
    kv = _first_line_with(log, ("KV cache is needed", "No available memory for the cache blocks"), from_needle=True)
    if kv is not None:
        return f"KV cache memory ran out ({kv})"
    host = _first_line_with(log, ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "on kv cache allocation"))
    if host is not None or returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        detail = f" ({host})" if host else " (killed by SIGKILL: the kernel's out-of-memory killer, most often)"
        return f"host memory ran out{detail}"
    if "Address already in use" in log:
        return "its port was taken"
    if returncode is None:
        load = os.getloadavg()[0]
        return f"time ran out: not healthy {waited_s:.0f} s after its launch (load {load:.1f} on {os.cpu_count()} CPUs)"
    error = _first_line_with(log, ("Error", "error:", "Exception"))
    return f"exited with {returncode}" + (f" ({error})" if error else "")


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
    #: What failure messages call it (a server kind of the pytest plugin).
    name: str = "vLLM"
    #: ``time.monotonic()`` at launch: :meth:`wait_ready`'s deadline counts from here.
    launched_at: float = field(default_factory=time.monotonic)
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
        kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES,
        python: str | None = None,
        name: str | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> VLLMServer:
        """Start the process and return at once; call :meth:`wait_ready` before use.

        ``python`` is the interpreter that runs the server (one with ``vllm-agentspec[cpu]``);
        by default this one. ``name`` labels its log file and failure messages; ``extra_env``
        adds to the environment it inherits.
        """
        port = free_port()
        owned: list[Path] = []
        log_root = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="agentspec-server-"))
        if not log_dir:
            owned.append(log_root)
        log_root.mkdir(parents=True, exist_ok=True)
        args = [*TEST_SERVER_ARGS, "--port", str(port), "--host", "127.0.0.1", *extra_args]
        if "--kv-cache-memory-bytes" not in extra_args:
            args += ["--kv-cache-memory-bytes", str(kv_cache_bytes)]
        state_dir: Path | None = None
        if agentspec:
            state_dir = Path(tempfile.mkdtemp(prefix="agentspec-state-"))
            owned.append(state_dir)
            settings = (settings or EngineSettings()).model_copy(update={"state_dir": str(state_dir)})
            runner = model_runner_for(installed_vllm_version(python))
            cmd = build_command(str(model_dir), args, python=python, drafter=settings.drafter, runner=runner)
            env = build_env(settings, runner=runner)
        else:
            cmd = [
                python or sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model_dir),
                *args,
            ]
            env = dict(os.environ)
            env.pop("AGENTSPEC_ENGINE_CONFIG", None)
        # The variable would override --kv-cache-memory-bytes (vLLM's CPU platform reads it last).
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.update(extra_env or {})
        name = name or ("agentspec" if agentspec else "plain")
        log_path = log_root / f"vllm-{name}-{port}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        step_log_dir = Path(settings.step_log_dir) if settings is not None and settings.step_log_dir else None
        return cls(proc, port, log_path, state_dir, step_log_dir=step_log_dir, name=name, _owned_dirs=owned)

    @classmethod
    def start(cls, model_dir: str | os.PathLike[str], *, timeout: float = 240.0, **kwargs: object) -> VLLMServer:
        """Launch and wait until ``/health`` answers 200."""
        server = cls.launch(model_dir, **kwargs)  # type: ignore[arg-type]
        server.wait_ready(timeout)
        return server

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Wait until ``/health`` answers 200, at most ``timeout`` seconds after the launch.

        Raises :class:`ServerStartError` (and stops the server) if it exits or runs out of time.
        """
        deadline = self.launched_at + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        returncode = self.proc.poll()
        waited = time.monotonic() - self.launched_at
        self.stop(remove_dirs=False)
        reason = start_failure_reason(returncode, self.log_text(), waited)
        raise ServerStartError(f"{self.name} server did not start: {reason}; log: {self.log_path}")

    def log_text(self, max_chars: int = 200_000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""

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

    def stop(self, grace: float = 15.0, *, remove_dirs: bool = True) -> None:
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
        if remove_dirs:
            for d in self._owned_dirs:
                shutil.rmtree(d, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
