"""Cancelling an attempt in flight when its backend is marked down.

A backend that hangs (a stopped process, a wedged GPU) answers nothing: a request to it
would wait for the whole read timeout although a health probe, or another call, has
already marked it down. The router calls every watcher of a backend it marks down
(:meth:`~agentspec.client.router.BackendRouter.watch`); the two shells here turn that into
an interrupted attempt, which raises :meth:`Attempt.interrupted
<agentspec.client.attempts.Attempt.interrupted>` (a :class:`BackendUnavailableError`), so
the retry machine treats it as any transport failure.

- async: every await of the attempt's I/O runs in its own anyio ``CancelScope``, which the
  watcher cancels. No scope spans a ``yield`` of the stream (a scope must not).
- sync: a blocked read cannot be interrupted from another thread portably (closing a
  socket does not wake a ``recv`` blocked on it, and httpx closes the connection on a read
  timeout, so a short timeout cannot be polled). The attempt's I/O runs in a worker thread
  that hands its results over a queue; the watcher puts a "cancelled" marker in that queue,
  so the caller resumes at once. An abandoned worker ends at the next event, at the
  socket shutdown done when a stream is given up on (once its response has arrived), or at
  its read timeout at the latest; its connection is not reused.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import anyio
import httpx
from httpx_sse import connect_sse

from .attempts import Attempt

_T = TypeVar("_T")

__all__ = ["AsyncGuard", "SyncStreamPump", "anext_or_none", "run_guarded"]

_CANCEL = object()


# ---------------------------------------------------------------------------- async


class AsyncGuard:
    """The awaits of one async attempt, cancelled when its backend is marked down."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self._scope: anyio.CancelScope | None = None
        self._thread = threading.get_ident()
        self._loop: Any = None
        try:
            import asyncio

            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # trio: a mark-down from another thread is seen at the next await
            self._loop = None
        attempt.on_mark_down(self._cancel)

    def _cancel(self, reason: str) -> None:
        if threading.get_ident() == self._thread:
            self._cancel_here()
        elif self._loop is not None:
            self._loop.call_soon_threadsafe(self._cancel_here)

    def _cancel_here(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    async def run(self, awaitable: Awaitable[_T]) -> _T:
        """``await awaitable``, or raise the attempt's interruption if its backend is (or
        gets) marked down first."""
        if self.attempt.cancelled is not None:
            if hasattr(awaitable, "close"):
                awaitable.close()  # type: ignore[attr-defined]
            raise self.attempt.interrupted()
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                return await awaitable
            finally:
                self._scope = None
        raise self.attempt.interrupted()  # reached only when the scope was cancelled


async def anext_or_none(iterator: Any) -> Any:
    """The next item of an async iterator, or ``None`` at its end."""
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        return None


# ---------------------------------------------------------------------------- sync


def run_guarded(attempt: Attempt, fn: Callable[[], _T]) -> _T:
    """``fn()`` in a worker thread: its result or its exception, or the attempt's
    interruption as soon as its backend is marked down."""
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def work() -> None:
        try:
            results.put((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            results.put((False, exc))

    attempt.on_mark_down(lambda reason: results.put(_CANCEL))
    threading.Thread(target=work, name="agentspec-call", daemon=True).start()
    item = results.get()
    if item is _CANCEL:
        raise attempt.interrupted()
    ok, value = item
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


class SyncStreamPump:
    """One streamed attempt read by a worker thread: :meth:`open` waits for the response,
    :meth:`events` yields the ``data`` of each server-sent event; both raise the worker's
    errors, or the attempt's interruption when its backend is marked down. :meth:`close`
    gives the stream up (the worker stops, its connection is shut down)."""

    def __init__(
        self,
        attempt: Attempt,
        http: httpx.Client,
        url: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
    ) -> None:
        self.attempt = attempt
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._response: httpx.Response | None = None
        self._finished = False
        self._stopped = False
        attempt.on_mark_down(self._cancel)
        self._worker = threading.Thread(
            target=self._work,
            args=(http, url, dict(body), dict(headers)),
            name="agentspec-stream",
            daemon=True,
        )
        self._worker.start()

    def _work(
        self,
        http: httpx.Client,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
    ) -> None:
        put = self._queue.put
        try:
            with connect_sse(http, "POST", url, json=body, headers=headers) as source:
                response = source.response
                with self._lock:
                    self._response = response
                try:
                    if response.status_code >= 300:
                        response.read()
                        put(("response", response))
                        return
                    put(("response", response))
                    for event in source.iter_sse():
                        if self._stopped:
                            return
                        put(("data", event.data))
                    put(("end", None))
                finally:
                    with self._lock:
                        self._finished = True
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            put(("error", exc))

    def _get(self) -> tuple[str, Any]:
        item = self._queue.get()
        if item is _CANCEL:
            raise self.attempt.interrupted()
        if item[0] == "error":
            raise item[1]
        return item  # type: ignore[no-any-return]

    def open(self) -> httpx.Response:
        """The response, once its headers (and, for an error status, its body) arrived."""
        _, response = self._get()
        return response  # type: ignore[no-any-return]

    def events(self) -> Iterator[str]:
        while True:
            kind, value = self._get()
            if kind == "end":
                return
            yield value

    def _cancel(self, reason: str) -> None:
        self._queue.put(_CANCEL)
        self.close()

    def close(self, *, abort: bool = True) -> None:
        """Stop the worker: it leaves at its next event; with ``abort`` (the stream was
        given up on, not read to its end), a read blocked on a live connection is woken by
        shutting the socket down."""
        self._stopped = True
        if not abort:
            return  # the response is at its end: the worker finishes it, the connection is reused
        with self._lock:
            if self._finished or self._response is None:
                return
            stream = self._response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if isinstance(sock, socket.socket):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
