"""Rollout engines on Ray: each a Ray actor running ``agentspec serve`` as its child.

```python
import ray
from agentspec_rl.ray_pool import EnginePool

ray.init()
with EnginePool("Qwen/Qwen2.5-7B-Instruct", engines=4, actor_options={"num_gpus": 1}) as pool:
    with pool.client(max_concurrency=256) as rollouts:
        groups = rollouts.generate_many(prompts, n=8, sampling=SamplingParams(max_tokens=1024))
```

Ray places and supervises the engines; dispatch is the rollout client's: a group is pinned
to one engine (its samples draft from each other there), load per engine is bounded, and a
sample whose engine dies is retried on another with its whole context (token ids), so no
sample is lost and none is returned twice. Closing the pool stops each server, with its
vLLM engine core and workers (:meth:`EngineActor.stop`), before the actor goes: the engine
core does not watch the server, and left to Ray (``ray.kill``, then ``ray.shutdown()``) it
has outlived both. The server stays in the actor's process group (never a session of its
own), which Ray cleans up when an actor dies unasked (a crash).
Needs ``ray`` (``pip install "agentspec-rl[ray]"``) and, where the actors run,
``vllm-agentspec[serve]`` (or ``[cpu]``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from agentspec_rl.client import RolloutClient

__all__ = ["EngineActor", "EnginePool"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineActor:
    """One ``agentspec serve`` process, owned by a Ray actor (see :class:`EnginePool`)."""

    def __init__(
        self, model: str, serve_args: Sequence[str], settings_json: str | None, env: Mapping[str, str]
    ) -> None:
        import httpx  # noqa: F401 - fail here, in the actor, if the client is missing

        from agentspec.engine.launcher.serve import build_command, build_env
        from agentspec.engine.settings import EngineSettings

        self.port = _free_port()
        workdir = tempfile.mkdtemp(prefix="agentspec-engine-")
        settings = EngineSettings.model_validate_json(settings_json) if settings_json else EngineSettings()
        if settings.state_dir is None:  # where the engine publishes its statistics (as agentspec serve does)
            settings = settings.model_copy(update={"state_dir": os.path.join(workdir, "state")})
        args = [*serve_args, "--host", "127.0.0.1", "--port", str(self.port)]
        command = build_command(model, args, python=sys.executable)
        full_env = {**build_env(settings), **env}
        self.log_path = os.path.join(workdir, "serve.log")
        with open(self.log_path, "wb") as log:
            # No start_new_session: in the actor's session the server dies with the actor.
            self.proc = subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float) -> str:
        """The server's URL once ``/health`` answers; raises with the log's tail otherwise."""
        import httpx

        url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agentspec serve exited with {self.proc.returncode}:\n{self._tail()}")
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"agentspec serve not healthy after {timeout_s:.0f} s:\n{self._tail()}")

    def pid(self) -> int:
        return self.proc.pid

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the server and every process under it (vLLM's engine core and workers):
        SIGTERM, then SIGKILL for whatever is left after ``grace_s``. Idempotent."""
        _stop_tree(self.proc, signal.SIGTERM, grace_s)

    def kill_server(self) -> None:
        """SIGKILL the server and every process under it at once, as a crash would."""
        _stop_tree(self.proc, signal.SIGKILL, 0.0)

    def _tail(self, lines: int = 40) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])


def _stop_tree(proc: subprocess.Popen[bytes], sig: signal.Signals, grace_s: float) -> None:
    """Send ``sig`` to ``proc`` and its descendants, wait up to ``grace_s``, SIGKILL the rest."""
    import psutil  # vLLM's own dependency: there wherever the server runs

    if proc.poll() is not None:  # reaped: its pid may be another process's by now
        return
    try:
        server = psutil.Process(proc.pid)
        # Listed before anything is signalled: once the server is gone its engine core and
        # workers belong to init and can no longer be found from here.
        tree = [server, *server.children(recursive=True)]
    except psutil.NoSuchProcess:  # already reaped
        tree = []
    for p in tree:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10.0)
    proc.wait(10.0)  # reap the server (it is this process's child)


class EnginePool:
    """``engines`` Ray actors, each serving ``model`` with ``agentspec serve``.

    Call ``ray.init`` first. ``serve_args`` are vLLM's options (as after ``agentspec serve
    MODEL``); ``settings`` an :class:`agentspec.engine.settings.EngineSettings` (agentspec's);
    ``engine_env`` per-engine environment variables (for instance CPU binding), one mapping
    per engine; ``actor_options`` Ray's (``num_cpus``, ``num_gpus``, ...).
    """

    def __init__(
        self,
        model: str,
        engines: int,
        *,
        serve_args: Sequence[str] = (),
        settings: Any = None,
        engine_env: Sequence[Mapping[str, str]] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        ready_timeout_s: float = 600.0,
    ) -> None:
        import ray

        if engines < 1:
            raise ValueError(f"engines must be at least 1, got {engines}")
        if engine_env is not None and len(engine_env) != engines:
            raise ValueError(f"{len(engine_env)} engine environments for {engines} engines")
        remote = ray.remote(EngineActor).options(**{"num_cpus": 1, **dict(actor_options or {})})
        settings_json = settings.model_dump_json() if settings is not None else None
        self.model = model
        self.actors = [
            remote.remote(model, list(serve_args), settings_json, dict(engine_env[i]) if engine_env else {})
            for i in range(engines)
        ]
        try:
            self.urls: list[str] = ray.get([a.wait_ready.remote(ready_timeout_s) for a in self.actors])
        except Exception:
            self.shutdown()
            raise

    def client(self, served_model: str | None = None, **settings: Any) -> RolloutClient:
        """A :class:`RolloutClient` over the pool's engines (``settings``: its options)."""
        return RolloutClient(self.urls, served_model or self.model, **settings)

    def kill(self, index: int) -> None:
        """Kill engine ``index`` (its server's processes, then its actor), as a failure would."""
        import ray

        actor = self.actors[index]
        try:
            ray.get(actor.kill_server.remote(), timeout=30.0)
        except ray.exceptions.RayError:  # a dead or hung actor: ray.kill is all there is left
            pass
        ray.kill(actor, no_restart=True)

    def shutdown(self, grace_s: float = 15.0) -> None:
        """Stop every engine's server (see :meth:`EngineActor.stop`), then its actor."""
        import ray

        stops = [a.stop.remote(grace_s) for a in self.actors]
        for ref in stops:
            try:
                ray.get(ref, timeout=grace_s + 30.0)
            except ray.exceptions.RayError:  # an actor already dead (kill) or hung: killed below
                pass
        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()
