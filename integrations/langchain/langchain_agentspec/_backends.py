"""Choosing a backend per call: agentspec's rendezvous pinning plus failure marking.

A LangChain model has no "session open/close" events, only calls. So each group (or
session without a group) seen counts as one open session of the pin table until it falls
out of a bounded LRU; that keeps the bounded-load placement meaningful and the memory
bounded for a process that serves millions of threads.

A backend is marked down when a call to it fails to connect, times out or answers 5xx.
There is no background prober: after ``cooldown_s`` a down backend becomes a candidate
again and the next call that lands there is the probe (a half-open circuit breaker). Pinned
groups never move back to a recovered backend — their draft index now lives elsewhere.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import openai

from agentspec.client.health import BackendState, HealthBook
from agentspec.client.routing import PinTable

__all__ = ["BackendPool", "is_backend_failure", "normalise_backend"]


def normalise_backend(url: str) -> str:
    """A backend as agentspec's client spells it: no trailing ``/`` and no ``/v1``."""
    url = url.strip().rstrip("/")
    url = url.removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        msg = f"backend URL must start with http:// or https://: {url!r}"
        raise ValueError(msg)
    return url


def is_backend_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) says the backend, not the request, failed.

    langchain-openai re-raises openai's errors wrapped in its own types, so the cause chain
    is walked. Connection errors, timeouts and 5xx count; 4xx (a bad request, a refused
    seed) and 429 (busy, not down) do not.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, openai.APIConnectionError):  # timeouts included
            return True
        if isinstance(current, openai.APIStatusError) and current.status_code >= 500:
            return True
        current = current.__cause__ or current.__context__
    return False


class BackendPool:
    """Thread-safe: pins, health and the bounded record of groups seen."""

    def __init__(
        self,
        backends: Sequence[str],
        *,
        load_factor: float = 1.25,
        cooldown_s: float = 30.0,
        max_groups: int = 10_000,
    ) -> None:
        if not backends:
            msg = "at least one backend is required"
            raise ValueError(msg)
        self.backends: tuple[str, ...] = tuple(
            dict.fromkeys(normalise_backend(b) for b in backends)
        )
        self._pins = PinTable(load_factor)
        self._health = HealthBook(self.backends)
        self._cooldown_s = cooldown_s
        self._max_groups = max_groups
        self._groups: OrderedDict[str, None] = OrderedDict()
        self._failed_at: dict[str, float] = {}
        self._round_robin = itertools.cycle(self.backends)
        self._lock = threading.Lock()

    # -- health ---------------------------------------------------------------------------

    def candidates(self) -> list[str]:
        """Backends a call may go to: up ones, plus down ones whose cool-down has passed.

        When every backend is down and cooling, all of them are candidates: failing fast
        with no backend to try would turn a blip into an outage.
        """
        now = time.monotonic()
        with self._lock:
            failed_at = dict(self._failed_at)
        up = set(self._health.healthy())
        out = [
            b for b in self.backends if b in up or now - failed_at.get(b, 0.0) >= self._cooldown_s
        ]
        return out or list(self.backends)

    def mark_failed(self, backend: str, reason: str) -> None:
        with self._lock:
            self._failed_at[backend] = time.monotonic()
        self._health.mark_down(backend, reason)

    def mark_ok(self, backend: str) -> None:
        if not self._health.is_up(backend):
            self._health.mark_up(backend)

    def states(self) -> dict[str, BackendState]:
        """A snapshot of every backend's health."""
        return self._health.snapshot()

    # -- placement ------------------------------------------------------------------------

    def pick(self, key: str | None, exclude: Iterable[str] = ()) -> str:
        """The backend of a call whose pin key is ``key`` (None: a call outside any session).

        ``exclude`` holds backends this call already failed on; a group whose pin is
        excluded is re-pinned (the whole group moves, as agentspec's client does).
        """
        excluded = set(exclude)
        healthy = [b for b in self.candidates() if b not in excluded] or [
            b for b in self.backends if b not in excluded
        ]
        if not healthy:
            healthy = list(self.backends)
        if key is None:
            # No session: nothing to keep together, spread the load.
            for _ in range(len(self.backends)):
                backend = next(self._round_robin)
                if backend in healthy:
                    return backend
            return healthy[0]
        self._touch(key)
        return self._pins.resolve(key, healthy)

    def pinned(self, key: str) -> str | None:
        """The backend ``key`` is pinned to, if it is."""
        return self._pins.backend_of(key)

    def _touch(self, key: str) -> None:
        evicted: list[str] = []
        with self._lock:
            if key in self._groups:
                self._groups.move_to_end(key)
                return
            self._groups[key] = None
            while len(self._groups) > self._max_groups:
                old, _ = self._groups.popitem(last=False)
                evicted.append(old)
        # PinTable.resolve() counts an unregistered group as one session: unregistering
        # the evicted ones drops their pins and their share of the load.
        for old in evicted:
            self._pins.unregister(old)
