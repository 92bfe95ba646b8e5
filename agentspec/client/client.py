"""The clients: :class:`AgentSpecClient` (sync) and :class:`AsyncAgentSpecClient` (anyio).

A client owns one HTTP connection pool and a :class:`~agentspec.client.BackendRouter` (the
health record of its backends and the pins of its groups). It makes sessions; the sessions
make the calls. Nothing is global: two clients in one process share no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import anyio
import httpx
from anyio.abc import TaskGroup

from . import _wire
from ._core import ClientCore
from .config import ClientConfig
from .errors import ClientClosedError
from .health import HealthThread, aprobe_all, probe_all, run_health_loop
from .router import BackendRouter, BackendState
from .session import AsyncSession, Session

__all__ = ["AgentSpecClient", "AsyncAgentSpecClient"]


def _make_config(config: ClientConfig | None, kwargs: dict[str, Any]) -> ClientConfig:
    if config is not None and kwargs:
        raise TypeError("pass either a ClientConfig or keyword settings, not both")
    return config if config is not None else ClientConfig(**kwargs)


def _timeout(config: ClientConfig) -> httpx.Timeout:
    return httpx.Timeout(
        connect=config.connect_timeout_s,
        read=config.read_timeout_s,
        write=config.connect_timeout_s,
        pool=config.connect_timeout_s,
    )


class _ClientBase:
    _core: ClientCore

    @property
    def config(self) -> ClientConfig:
        return self._core.config

    @property
    def backends(self) -> tuple[str, ...]:
        return self._core.config.backends

    @property
    def router(self) -> BackendRouter:
        """The client's router: backend health and group pins, shared by its sessions."""
        return self._core.router

    def backend_states(self) -> dict[str, BackendState]:
        """A snapshot of every backend's health."""
        return self._core.router.states()

    def healthy_backends(self) -> list[str]:
        return self._core.router.healthy()

    def loads(self) -> dict[str, int]:
        """Open sessions per backend, over pinned groups."""
        return self._core.router.loads()

    def pinned_backend(self, group_id: str) -> str | None:
        """Where ``group_id`` (or a group-less session's id) is pinned, if it is."""
        return self._core.router.pinned(group_id)

    def mark_down(self, backend: str, reason: str = "marked down by the caller") -> None:
        """Take ``backend`` out of rotation until a health probe finds it up."""
        self._core.router.mark_down(backend, reason)

    def _targets(self, backends: Sequence[str] | None) -> Sequence[str]:
        self._check_open()
        return self.backends if backends is None else [self._core.router.canonical(b) for b in backends]

    def _check_open(self) -> None:
        if self._core.closed:
            raise ClientClosedError()

    def _new_ids(self, session_id: str | None, group_id: str | None) -> tuple[str, str | None]:
        sid = _wire.new_session_id() if session_id is None else session_id
        return sid, group_id


class AgentSpecClient(_ClientBase):
    """Sync client. ``AgentSpecClient(backends=["http://gpu1:8000", "http://gpu2:8000"])``
    or ``AgentSpecClient(ClientConfig(...))``.

    Thread-safe: sessions may run in different threads. Close it (or use ``with``) to stop the
    health thread and the connection pool.
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        /,
        *,
        http_client: httpx.Client | None = None,
        **settings: Any,
    ) -> None:
        self._core = ClientCore(_make_config(config, settings))
        self._own_http = http_client is None
        self._http = http_client or httpx.Client(timeout=_timeout(self.config))
        self._health_thread: HealthThread | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop health checks and close connections. Open sessions become unusable."""
        if self._core.closed:
            return
        self._core.closed = True
        if self._health_thread is not None:
            self._health_thread.stop()
        if self._own_http:
            self._http.close()

    def session(self, session_id: str | None = None, group_id: str | None = None) -> Session:
        """A new session (a random id when ``session_id`` is None), in group ``group_id``
        (the session alone when None). Raises :class:`InvalidIdError` for a bad id."""
        self._check_open()
        self._start_health_thread()
        sid, gid = self._new_ids(session_id, group_id)
        return Session(self, sid, gid)

    def check_health(self, backends: Sequence[str] | None = None) -> dict[str, BackendState]:
        """Probe ``backends`` (all when None) now; returns the new snapshot."""
        probe_all(self._http, self._core.router, self._targets(backends), self.config.health_timeout_s)
        return self.backend_states()

    def _start_health_thread(self) -> None:
        # Lazily, so a client that never opens a session starts no thread.
        interval = self.config.health_check_interval_s
        if interval is None or self._health_thread is not None:
            return
        thread = HealthThread(self._probe_all, interval)
        self._health_thread = thread
        thread.start()

    def _probe_all(self) -> None:
        if not self._core.closed:
            self.check_health()


class AsyncAgentSpecClient(_ClientBase):
    """Async twin of :class:`AgentSpecClient`.

    ``async with AsyncAgentSpecClient(backends=[...]) as client:`` runs the background
    health checks for the block's duration; without ``async with``, failures seen by calls
    (and an inline probe when every backend is down) still drive failover.
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        /,
        *,
        http_client: httpx.AsyncClient | None = None,
        **settings: Any,
    ) -> None:
        self._core = ClientCore(_make_config(config, settings))
        self._own_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=_timeout(self.config))
        self._task_group: TaskGroup | None = None

    async def __aenter__(self) -> Self:
        interval = self.config.health_check_interval_s
        if interval is not None:
            self._task_group = anyio.create_task_group()
            await self._task_group.__aenter__()
            self._task_group.start_soon(run_health_loop, self._probe_all, interval)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._task_group is not None:
                self._task_group.cancel_scope.cancel()
                # The block's own exception is not the health task's business: handing it
                # to the task group would wrap it in an ExceptionGroup. Let it propagate as is.
                await self._task_group.__aexit__(None, None, None)
                self._task_group = None
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close connections. Open sessions become unusable."""
        if self._core.closed:
            return
        self._core.closed = True
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()
        if self._own_http:
            await self._http.aclose()

    def session(self, session_id: str | None = None, group_id: str | None = None) -> AsyncSession:
        """Async :meth:`AgentSpecClient.session` (not a coroutine: it does no I/O)."""
        self._check_open()
        sid, gid = self._new_ids(session_id, group_id)
        return AsyncSession(self, sid, gid)

    async def check_health(self, backends: Sequence[str] | None = None) -> dict[str, BackendState]:
        """Probe ``backends`` (all when None) now, concurrently; returns the new snapshot."""
        await aprobe_all(self._http, self._core.router, self._targets(backends), self.config.health_timeout_s)
        return self.backend_states()

    async def _probe_all(self) -> None:
        await self.check_health()
