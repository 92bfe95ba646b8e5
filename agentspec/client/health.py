"""Backend health probes: the I/O that decides who is up.

A backend is marked down by a failed call (connection error, timeout, 5xx) or by a failed
``GET /health``; for the client only a successful probe marks it up again. Probes run in
the background (a daemon thread for the sync client, a task for the async one) every
``health_check_interval_s``, and inline when a call finds no healthy backend at all. The
record itself is the router's (:class:`~agentspec.client.router.BackendRouter`); marking a
backend down there cancels the requests in flight to it, retried (or resumed) elsewhere.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Sequence

import anyio
import httpx

from .attempts import describe
from .router import BackendRouter, BackendState

logger = logging.getLogger(__name__)

__all__ = [
    "BackendState",
    "HealthThread",
    "aprobe",
    "aprobe_all",
    "probe",
    "probe_all",
    "run_health_loop",
]


def _verdict(response: httpx.Response) -> tuple[bool, str | None]:
    if response.status_code == 200:
        return True, None
    return False, f"/health answered {response.status_code}"


def probe(http: httpx.Client, backend: str, timeout: float) -> tuple[bool, str | None]:
    """``GET {backend}/health``: (up, reason when down). Never raises for network errors."""
    try:
        return _verdict(http.get(f"{backend}/health", timeout=timeout))
    except httpx.HTTPError as exc:
        return False, f"/health failed: {describe(exc)}"


async def aprobe(http: httpx.AsyncClient, backend: str, timeout: float) -> tuple[bool, str | None]:
    """Async twin of :func:`probe`."""
    try:
        return _verdict(await http.get(f"{backend}/health", timeout=timeout))
    except httpx.HTTPError as exc:
        return False, f"/health failed: {describe(exc)}"


def probe_all(http: httpx.Client, router: BackendRouter, backends: Sequence[str], timeout: float) -> None:
    """Probe ``backends`` one after another and record the verdicts."""
    for backend in backends:
        router.record(backend, *probe(http, backend, timeout))


async def aprobe_all(http: httpx.AsyncClient, router: BackendRouter, backends: Sequence[str], timeout: float) -> None:
    """Probe ``backends`` concurrently and record the verdicts."""

    async def one(backend: str) -> None:
        router.record(backend, *(await aprobe(http, backend, timeout)))

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
