"""Backend health: who is up, and the probes that decide it.

A backend is marked down by a failed call (connection error, timeout, 5xx) or by a failed
``GET /health``; only a successful probe marks it up again. Probes run in the background
(a daemon thread for the sync client, a task for the async one) every
``health_check_interval_s``, and inline when a call finds no healthy backend at all.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio
import httpx

logger = logging.getLogger(__name__)

__all__ = [
    "BackendState",
    "HealthBook",
    "HealthThread",
    "aprobe",
    "aprobe_all",
    "probe",
    "probe_all",
    "run_health_loop",
]


@dataclasses.dataclass(frozen=True)
class BackendState:
    """A snapshot of one backend's health."""

    url: str
    up: bool
    since: float
    """``time.monotonic()`` of the last change of ``up``."""
    consecutive_failures: int
    last_error: str | None


class HealthBook:
    """Thread-safe up/down record of the configured backends (all start up)."""

    def __init__(self, backends: Sequence[str]) -> None:
        now = time.monotonic()
        self._order = tuple(backends)
        self._states = {b: BackendState(b, True, now, 0, None) for b in self._order}
        self._lock = threading.Lock()

    @property
    def backends(self) -> tuple[str, ...]:
        return self._order

    def healthy(self) -> list[str]:
        """Backends currently up, in configuration order."""
        with self._lock:
            return [b for b in self._order if self._states[b].up]

    def down(self) -> list[str]:
        with self._lock:
            return [b for b in self._order if not self._states[b].up]

    def is_up(self, backend: str) -> bool:
        with self._lock:
            return self._states[backend].up

    def mark_down(self, backend: str, reason: str) -> None:
        with self._lock:
            old = self._states[backend]
            self._states[backend] = BackendState(
                backend,
                False,
                old.since if not old.up else time.monotonic(),
                old.consecutive_failures + 1,
                reason,
            )

    def mark_up(self, backend: str) -> None:
        with self._lock:
            old = self._states[backend]
            self._states[backend] = BackendState(
                backend, True, old.since if old.up else time.monotonic(), 0, old.last_error
            )

    def snapshot(self) -> dict[str, BackendState]:
        with self._lock:
            return dict(self._states)

    def record(self, backend: str, ok: bool, reason: str | None) -> None:
        if ok:
            self.mark_up(backend)
        else:
            self.mark_down(backend, reason or "health check failed")


def _verdict(response: httpx.Response) -> tuple[bool, str | None]:
    if response.status_code == 200:
        return True, None
    return False, f"/health answered {response.status_code}"


def probe(http: httpx.Client, backend: str, timeout: float) -> tuple[bool, str | None]:
    """``GET {backend}/health``: (up, reason when down). Never raises for network errors."""
    try:
        return _verdict(http.get(f"{backend}/health", timeout=timeout))
    except httpx.HTTPError as exc:
        return False, f"/health failed: {exc!r}"


async def aprobe(http: httpx.AsyncClient, backend: str, timeout: float) -> tuple[bool, str | None]:
    """Async twin of :func:`probe`."""
    try:
        return _verdict(await http.get(f"{backend}/health", timeout=timeout))
    except httpx.HTTPError as exc:
        return False, f"/health failed: {exc!r}"


def probe_all(http: httpx.Client, book: HealthBook, backends: Sequence[str], timeout: float) -> None:
    """Probe ``backends`` one after another and record the verdicts."""
    for backend in backends:
        book.record(backend, *probe(http, backend, timeout))


async def aprobe_all(
    http: httpx.AsyncClient, book: HealthBook, backends: Sequence[str], timeout: float
) -> None:
    """Probe ``backends`` concurrently and record the verdicts."""

    async def one(backend: str) -> None:
        book.record(backend, *(await aprobe(http, backend, timeout)))

    async with anyio.create_task_group() as tg:
        for backend in backends:
            tg.start_soon(one, backend)


class HealthThread(threading.Thread):
    """Daemon thread that probes every backend every ``interval`` seconds until stopped."""

    def __init__(self, run_once: Callable[[], None], interval: float) -> None:
        super().__init__(name="agentspec-health", daemon=True)
        self._run_once = run_once
        self._interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            try:
                self._run_once()
            except Exception:  # a probe bug must not kill the monitor
                logger.warning("agentspec health check failed", exc_info=True)

    def stop(self) -> None:
        self._stop_event.set()


async def run_health_loop(run_once: Callable[[], Awaitable[None]], interval: float) -> None:
    """Async twin of :class:`HealthThread`: probe forever; cancel the task to stop it."""
    while True:
        await anyio.sleep(interval)
        try:
            await run_once()
        except Exception:  # a probe bug must not kill the monitor
            logger.warning("agentspec health check failed", exc_info=True)
