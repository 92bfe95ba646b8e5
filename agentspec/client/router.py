"""The backend router: backends, their health, and the pins of groups, with no I/O.

:class:`BackendRouter` is what the session-aware client routes with, and what framework
integrations use instead of the client's private pieces. It keeps

- each backend's health (up, or down since a failure, with the reason);
- the pin of each group to one backend, by rendezvous hashing with bounded load
  (:mod:`agentspec.client.routing`), and how many open sessions each group holds;
- optionally a cool-down after which a down backend is tried again by the next call that
  lands there (a half-open circuit breaker, for callers that run no health probe), and a
  bound on groups routed without an open session (least recently used are forgotten).

It does no I/O; :meth:`BackendRouter.attempts` makes the sans-I/O state machine of one
call's retries (:mod:`agentspec.client.attempts`), and :meth:`~BackendRouter.retry`,
:meth:`~BackendRouter.aretry`, :meth:`~BackendRouter.call` and :meth:`~BackendRouter.acall`
drive it for a caller-supplied send function, sleeping between attempts.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterator,
    Sequence,
)
from typing import Any, TypeVar

import httpx

from .attempts import (
    Attempt,
    CallAttempts,
    Classifier,
    Failure,
    FailureKind,
    classify_error,
    describe,
    parse_retry_after,
)
from .config import RetryPolicy, normalise_backend
from .errors import BackendUnavailableError
from .retrying import AsyncAttemptIterator, AttemptIterator
from .routing import PinTable

__all__ = ["BackendRouter", "BackendState", "classify_http_error"]

_T = TypeVar("_T")

logger = logging.getLogger(__name__)


def classify_http_error(exc: BaseException, backend: str) -> Failure:
    """The router's classifier: agentspec's own errors (:func:`classify_error`), httpx's
    transport errors (connection, timeout, a broken stream: the backend failed), and the
    ``httpx.HTTPStatusError`` of ``raise_for_status()`` (5xx: the backend failed; 429: busy;
    other 4xx: refused). The caller sees httpx's error itself when the call stops on it."""
    if isinstance(exc, httpx.TransportError):
        exc = BackendUnavailableError(backend, describe(exc))
    elif isinstance(exc, httpx.HTTPStatusError):
        response = exc.response
        code = response.status_code
        retry_after = parse_retry_after(response.headers, time.time())
        reason = f"{code}: {response.reason_phrase}"
        if code >= 500:
            return Failure(FailureKind.BACKEND, exc, reason, retry_after)
        if code == 429:
            return Failure(FailureKind.BUSY, exc, reason, retry_after)
        return Failure(FailureKind.REFUSED, exc)
    return classify_error(exc, backend)


@dataclasses.dataclass(frozen=True)
class BackendState:
    """A snapshot of one backend's health."""

    url: str
    up: bool
    since: float
    """``time.monotonic()`` of the last change of ``up``."""
    consecutive_failures: int
    last_error: str | None


class _HealthBook:
    """Thread-safe up/down record of the configured backends (all start up)."""

    def __init__(self, backends: Sequence[str], clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
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
                old.since if not old.up else self._clock(),
                old.consecutive_failures + 1,
                reason,
            )

    def mark_up(self, backend: str) -> None:
        with self._lock:
            old = self._states[backend]
            self._states[backend] = BackendState(
                backend, True, old.since if old.up else self._clock(), 0, old.last_error
            )

    def snapshot(self) -> dict[str, BackendState]:
        with self._lock:
            return dict(self._states)


class BackendRouter:
    """Routes calls to backends: health, group pins, and the attempts of a call.

    ``backends`` are base URLs (a trailing ``/`` or ``/v1`` is dropped, duplicates too).
    ``load_factor`` bounds the load when a new group is pinned (see
    :func:`~agentspec.client.routing.load_cap`). With ``cooldown_s`` a backend that failed
    becomes a candidate again that long after its last failure, and the next success there
    marks it up; when every backend is down all are candidates (failing fast would turn a
    blip into an outage). Without it, as in the client, only :meth:`mark_up` (a health
    probe) brings a backend back. ``max_groups`` bounds how many groups routed without
    :meth:`open_session` are remembered. ``clock`` is ``time.monotonic`` unless a test
    injects one.

    Thread-safe and I/O-free: share one router between threads and tasks.

    ```python
    router = BackendRouter(["http://gpu1:8000", "http://gpu2:8000"], cooldown_s=30)
    reply = router.call("task-17", lambda backend: post(backend, body))
    ```
    """

    def __init__(
        self,
        backends: Sequence[str],
        *,
        load_factor: float = 1.25,
        cooldown_s: float | None = None,
        max_groups: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(backends, str):
            backends = [backends]
        self.backends: tuple[str, ...] = tuple(dict.fromkeys(normalise_backend(b) for b in backends))
        """The backends, normalised, in the order given."""
        if not self.backends:
            raise ValueError("at least one backend is required")
        if cooldown_s is not None and cooldown_s < 0:
            raise ValueError("cooldown_s must be non-negative")
        if max_groups is not None and max_groups < 1:
            raise ValueError("max_groups must be positive")
        self._health = _HealthBook(self.backends, clock)
        self._pins = PinTable(load_factor)
        self._cooldown_s = cooldown_s
        self._max_groups = max_groups
        self._clock = clock
        self._failed_at: dict[str, float] = {}
        self._open: dict[str, int] = {}  # open sessions per group, through open_session()
        self._implicit: OrderedDict[str, None] = OrderedDict()  # groups routed without one
        self._next = 0  # round robin of key-less calls
        self._lock = threading.Lock()
        # Requests in flight, per backend: called with the reason when it is marked down.
        self._watchers: dict[str, dict[int, Callable[[str], object]]] = {b: {} for b in self.backends}
        self._watch_ids = 0

    # -- health ---------------------------------------------------------------------------

    def canonical(self, backend: str) -> str:
        if backend in self.backends:
            return backend
        url = normalise_backend(backend)
        if url not in self.backends:
            raise ValueError(f"unknown backend {backend!r}")
        return url

    def states(self) -> dict[str, BackendState]:
        """A snapshot of every backend's health."""
        return self._health.snapshot()

    def healthy(self) -> list[str]:
        """Backends marked up, in configuration order."""
        return self._health.healthy()

    def down(self) -> list[str]:
        """Backends marked down, in configuration order."""
        return self._health.down()

    def is_up(self, backend: str) -> bool:
        """Whether ``backend`` is marked up."""
        return self._health.is_up(self.canonical(backend))

    def mark_down(self, backend: str, reason: str) -> None:
        """Take ``backend`` out of rotation (until :meth:`mark_up`, or its cool-down)."""
        backend = self.canonical(backend)
        with self._lock:
            self._failed_at[backend] = self._clock()
            watchers = list(self._watchers[backend].values())
        self._health.mark_down(backend, reason)
        # What is in flight there would only wait for the read timeout: cancel it, so the
        # retry machine sends it elsewhere (outside the lock: a callback may re-enter).
        for cancel in watchers:
            try:
                cancel(reason)
            except Exception:  # one caller's bug must not keep the others waiting
                logger.warning("agentspec: cancelling a request on %s failed", backend, exc_info=True)

    def watch(self, backend: str, cancel: Callable[[str], object]) -> int:
        """Call ``cancel(reason)`` when ``backend`` is marked down (by a health probe, or a
        failed call), until :meth:`unwatch` with the returned handle. How a request in flight
        there is cancelled rather than left to its read timeout; ``cancel`` must not block
        (it runs in the thread, or task, that marks the backend down)."""
        backend = self.canonical(backend)
        with self._lock:
            self._watch_ids += 1
            handle = self._watch_ids
            self._watchers[backend][handle] = cancel
        return handle

    def unwatch(self, handle: int) -> None:
        """Stop a :meth:`watch` (no-op when already stopped)."""
        with self._lock:
            for watchers in self._watchers.values():
                if watchers.pop(handle, None) is not None:
                    return

    def watching(self, backend: str) -> int:
        """How many requests in flight to ``backend`` are watched (for tests)."""
        with self._lock:
            return len(self._watchers[self.canonical(backend)])

    def mark_up(self, backend: str) -> None:
        """Put ``backend`` back into rotation (a health probe found it up)."""
        self._health.mark_up(self.canonical(backend))

    def record(self, backend: str, ok: bool, reason: str | None = None) -> None:
        """Record a health probe's verdict."""
        if ok:
            self.mark_up(backend)
        else:
            self.mark_down(backend, reason or "health check failed")

    def record_success(self, backend: str) -> None:
        """A call succeeded on ``backend``. With a cool-down, that is the probe that marks
        a down backend up again; without, only :meth:`mark_up` does."""
        if self._cooldown_s is not None and not self._health.is_up(backend):
            self._health.mark_up(backend)

    def candidates(self) -> list[str]:
        """Backends a call may go to now: those up, plus (with a cool-down) down ones whose
        cool-down has passed, or every backend when none is left."""
        states = self._health.snapshot()
        out = [b for b in self.backends if states[b].up]
        if self._cooldown_s is None or len(out) == len(self.backends):
            return out
        now = self._clock()
        with self._lock:
            failed_at = dict(self._failed_at)
        out = [b for b in self.backends if states[b].up or now - failed_at.get(b, -float("inf")) >= self._cooldown_s]
        return out or list(self.backends)

    def is_candidate(self, backend: str) -> bool:
        """Whether a call may go to ``backend`` now (see :meth:`candidates`)."""
        return backend in self.candidates()

    # -- groups and pins ------------------------------------------------------------------

    def open_session(self, group: str) -> None:
        """Count one more open session of ``group`` (its share of its backend's load)."""
        with self._lock:
            self._open[group] = self._open.get(group, 0) + 1
            self._implicit.pop(group, None)
        self._pins.register(group)

    def close_session(self, group: str) -> None:
        """Count one session of ``group`` fewer; the pin goes with the group's last session."""
        with self._lock:
            n = self._open.get(group, 0) - 1
            if n > 0:
                self._open[group] = n
            else:
                self._open.pop(group, None)
        self._pins.unregister(group)

    def resolve(self, key: str | None, exclude: Collection[str] = ()) -> str | None:
        """The backend of a call whose pin key is ``key``; None when no backend is a candidate.

        A group keeps its pin while that is a candidate; else the whole group is re-pinned
        (rendezvous order, bounded load) among the candidates not in ``exclude`` (all the
        candidates when that leaves none). A group without an open session counts as one.
        ``key=None`` (a call outside any session) takes the candidates in turn.
        """
        candidates = self.candidates()
        if not candidates:
            return None
        allowed = [b for b in candidates if b not in exclude] or candidates
        if key is None:
            with self._lock:
                turn = self._next
                self._next += 1
            return allowed[turn % len(allowed)]
        if self._max_groups is not None:
            self._touch(key)
        return self._pins.resolve(key, allowed)

    def pinned(self, group: str) -> str | None:
        """The backend ``group`` is pinned to, or None when it is not pinned."""
        return self._pins.backend_of(group)

    def loads(self) -> dict[str, int]:
        """Open sessions per backend, over pinned groups."""
        return self._pins.loads()

    def _touch(self, key: str) -> None:
        assert self._max_groups is not None
        evicted: list[str] = []
        with self._lock:
            if key in self._open:
                return
            if key in self._implicit:
                self._implicit.move_to_end(key)
                return
            self._implicit[key] = None
            while len(self._implicit) > self._max_groups:
                evicted.append(self._implicit.popitem(last=False)[0])
        # resolve() counts a group without sessions as one: forgetting it drops its pin.
        for old in evicted:
            self._pins.unregister(old)

    # -- the attempts of a call -----------------------------------------------------------

    def attempts(
        self,
        key: str | None,
        policy: RetryPolicy | None = None,
        *,
        check_open: Callable[[], None] | None = None,
        classify: Classifier = classify_http_error,
        prefer: str | None = None,
        probe: bool = False,
        reraise: bool = False,
        rng: random.Random | None = None,
    ) -> CallAttempts:
        """The state machine of one call's attempts (see :class:`CallAttempts`), for a
        caller that drives it itself. ``classify`` defaults to :func:`classify_http_error`."""
        return CallAttempts(
            self,
            key,
            policy,
            check_open=check_open,
            classify=classify,
            prefer=prefer,
            probe=probe,
            reraise=reraise,
            rng=rng,
        )

    def retry(
        self,
        key: str | None,
        policy: RetryPolicy | None = None,
        *,
        probe: Callable[[Sequence[str]], object] | None = None,
        sleep: Callable[[float], object] | None = None,
        **options: Any,
    ) -> Iterator[Attempt]:
        """Iterate the attempts of one call, sleeping between them (``time.sleep``)::

            for attempt in router.retry("task-17"):
                with attempt:
                    return send(attempt.backend)

        ``probe(backends)``, when given, is called when no backend is a candidate; the
        other options are :meth:`attempts`'. The loop ends by returning from the block, or
        by the error the call stops with.
        """
        machine = self.attempts(key, policy, probe=probe is not None, **options)
        return AttemptIterator(machine, probe=probe, sleep=sleep)

    def aretry(
        self,
        key: str | None,
        policy: RetryPolicy | None = None,
        *,
        probe: Callable[[Sequence[str]], Awaitable[object]] | None = None,
        sleep: Callable[[float], Awaitable[object]] | None = None,
        **options: Any,
    ) -> AsyncIterator[Attempt]:
        """Async :meth:`retry` (``anyio.sleep``): ``async for attempt in router.aretry(key)``."""
        machine = self.attempts(key, policy, probe=probe is not None, **options)
        return AsyncAttemptIterator(machine, probe=probe, sleep=sleep)

    def call(
        self,
        key: str | None,
        send: Callable[[str], _T],
        policy: RetryPolicy | None = None,
        **options: Any,
    ) -> _T:
        """``send(backend)`` with retries and failover; its result, or the error the call
        stops with. Options as :meth:`retry`'s."""
        for attempt in self.retry(key, policy, **options):
            with attempt:
                return send(attempt.backend)
        raise AssertionError("unreachable: attempts end by returning or raising")

    async def acall(
        self,
        key: str | None,
        send: Callable[[str], Awaitable[_T]],
        policy: RetryPolicy | None = None,
        **options: Any,
    ) -> _T:
        """Async :meth:`call`: ``await send(backend)``."""
        async for attempt in self.aretry(key, policy, **options):
            with attempt:
                return await send(attempt.backend)
        raise AssertionError("unreachable: attempts end by returning or raising")

    def __repr__(self) -> str:
        return f"<BackendRouter {len(self.healthy())}/{len(self.backends)} up>"
