"""Test servers started a few at a time, each alive only while tests need it.

A machine with two cores cannot boot seven vLLM servers at once within any fair deadline:
each start is mostly CPU (imports, model load, KV cache). :class:`ServerPool` knows the
run's plan (the server kinds each test uses, in run order) and

- starts at most ``max_starting`` servers at a time, each start's deadline counted from its
  own launch;
- starts the next kind the plan needs while the current tests run (one ahead at most, and
  none while :data:`PREFETCH_MAX_ALIVE` servers are alive);
- stops a server once no later test uses it;
- remembers a kind that failed to start, so its other users fail at once with the same
  one-line :class:`~agentspec.testing.server.ServerStartError`, and other kinds go on.

It knows nothing of pytest: :mod:`agentspec.testing.pytest_plugin` feeds it the plan and
tells it when each test is done.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from agentspec.testing.server import ServerStartError, VLLMServer
from agentspec.testing.server_kinds import KindContext, ServerKind

#: Overrides how many servers may start at once (default: one per two CPUs).
ENV_MAX_STARTING = "AGENTSPEC_TEST_SERVER_STARTS"
#: Seconds a server has from its launch to answer ``/health``.
START_TIMEOUT_S = 300.0
#: No server is started ahead of its tests while this many are alive (about 2.5 GB each:
#: a 2-core, 24 GB machine keeps the whole run under 12 GB).
PREFETCH_MAX_ALIVE = 2


def available_cpus() -> list[int]:
    """The CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def default_max_starting() -> int:
    """One start per two CPUs (a start keeps about one core busy, the tests another)."""
    if value := os.environ.get(ENV_MAX_STARTING):
        return max(1, int(value))
    return max(1, len(available_cpus()) // 2)


def core_slices(cpus: Sequence[int], per_slice: int | None = None) -> list[str]:
    """CPU lists for ``VLLM_CPU_OMP_THREADS_BIND``, handed out round-robin, so that two
    servers of one test do not share a core (vLLM binds every server's worker to the same
    cores otherwise). A quarter of the CPUs each, at least one."""
    size = per_slice or max(1, len(cpus) // 4)
    return [",".join(map(str, cpus[i : i + size])) for i in range(0, len(cpus) - size + 1, size)]


class ServerPool:
    """Starts, hands out and stops the servers of one test run; see the module's docstring."""

    def __init__(
        self,
        context: KindContext,
        plan: Sequence[Sequence[ServerKind]],
        *,
        max_starting: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.context = context
        self._plan = [tuple(kinds) for kinds in plan]
        self._max_starting = max_starting or default_max_starting()
        self._timeout = start_timeout_s
        self._position = -1  # the last test that finished
        self._last_use: dict[str, int] = {}
        for index, kinds in enumerate(self._plan):
            for kind in kinds:
                self._last_use[kind.name] = index
        self._servers: dict[str, VLLMServer] = {}
        self._ready: set[str] = set()
        self._handed_out: set[str] = set()  # got by a test since its launch
        self._failed: dict[str, ServerStartError] = {}
        cpus = available_cpus()
        self._bindings = core_slices(cpus) if len(cpus) > 1 else []
        self._launches = 0
        self._closed = False

    # -- what tests call -----------------------------------------------------------------

    def get(self, kind: ServerKind) -> VLLMServer:
        """The running, healthy server of ``kind``, started (or waited for) if need be.

        Raises :class:`ServerStartError` (one line) if it cannot start, now or earlier in the run.
        """
        if kind.name in self._failed:
            raise self._failed[kind.name]
        server = self._servers.get(kind.name)
        if server is not None and server.proc.poll() is not None:
            if not kind.disposable and kind.name in self._ready:
                raise ServerStartError(
                    f"{kind.name} server exited with {server.proc.returncode} during the tests; log: {server.log_path}"
                )
            self._forget(kind.name)
            server = None
        if server is None:
            self._wait_for_slot()
            server = self._launch(kind)
        self._await(kind.name)
        self._handed_out.add(kind.name)
        self._prefetch()
        return server

    def finished(self, index: int) -> None:
        """The test at ``index`` of the plan is done: stop what no later test uses, start
        what the next ones will."""
        self._position = index
        if self._closed:
            return  # a teardown after the session's: start nothing
        for name in list(self._servers):
            if self._last_use.get(name, len(self._plan)) <= index:
                self._forget(name)
        self._prefetch()

    def close(self) -> None:
        """Stop every server; the pool starts none after this."""
        self._closed = True
        for name in list(self._servers):
            self._forget(name)

    @property
    def running(self) -> list[str]:
        """The kinds with a server process alive (started or starting)."""
        return [name for name, s in self._servers.items() if s.proc.poll() is None]

    # -- internals -----------------------------------------------------------------------

    def _launch(self, kind: ServerKind) -> VLLMServer:
        env: dict[str, str] = {}
        if self._bindings and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self._bindings[self._launches % len(self._bindings)]
        self._launches += 1
        try:
            server = kind.launch(self.context, extra_env=env)
        except Exception as exc:  # noqa: BLE001 - its model could not be built, its command refused
            # One line for the kind's tests, as for a server that starts and dies.
            lines = str(exc).strip().splitlines()
            error = ServerStartError(f"{kind.name} server did not start: {lines[-1] if lines else type(exc).__name__}")
            self._failed[kind.name] = error
            raise error from exc
        self._servers[kind.name] = server
        return server

    def _starting(self) -> list[str]:
        return [name for name in self._servers if name not in self._ready]

    def _wait_for_slot(self) -> None:
        while len(self._starting()) >= self._max_starting:
            try:
                self._await(self._starting()[0])
            except ServerStartError:
                pass  # that kind's own users report it

    def _await(self, name: str) -> None:
        if name in self._ready:
            return
        try:
            self._servers[name].wait_ready(self._timeout)
        except ServerStartError as error:
            self._failed[name] = error
            del self._servers[name]
            raise
        self._ready.add(name)

    def _prefetch(self) -> None:
        """Launch the next kind the plan needs, if a start slot is free, no server is
        waiting for its first user already and few are alive (each costs memory)."""
        if self._closed:
            return
        ahead = [name for name in self._servers if name not in self._handed_out]
        if ahead or len(self._starting()) >= self._max_starting or len(self._servers) >= PREFETCH_MAX_ALIVE:
            return
        for kinds in self._plan[self._position + 1 :]:
            for kind in kinds:
                if kind.name not in self._servers and kind.name not in self._failed:
                    try:
                        self._launch(kind)
                    except ServerStartError:
                        pass  # its own users report it
                    return

    def _forget(self, name: str) -> None:
        server = self._servers.pop(name)
        self._ready.discard(name)
        self._handed_out.discard(name)
        server.stop()
