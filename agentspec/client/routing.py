"""Pinning groups to backends: rendezvous hashing with bounded load.

The functions here are pure: same inputs, same answer, in every process. Scores use
blake2b rather than Python's ``hash``, which is salted per process, so two client
processes configured with the same backend list pin an idle group to the same backend —
the backend whose draft index already holds that group's text.

Bounded load (consistent hashing with bounded loads, applied to the rendezvous order): a new
group walks the backends in descending score order and takes the first whose active session
count is below ``ceil(factor * (total + 1) / n)``. No backend then exceeds ``factor`` times
the mean by more than one session, while most groups still land on their first choice.

:class:`PinTable` is the only stateful piece: the client's record of which group is pinned
where and how many open sessions each pin holds. It does no I/O.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from fractions import Fraction

__all__ = [
    "PinTable",
    "load_cap",
    "pick_backend",
    "rendezvous_order",
    "rendezvous_score",
]


def rendezvous_score(key: str, backend: str) -> int:
    """The 64-bit rendezvous (highest-random-weight) score of ``backend`` for ``key``."""
    digest = hashlib.blake2b(key.encode("utf-8") + b"\x00" + backend.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, backends: Iterable[str]) -> list[str]:
    """``backends`` sorted by descending score for ``key`` (ties broken by name).

    The order does not depend on the order of ``backends``; removing a backend leaves the
    relative order of the others unchanged, so only the keys it held move.
    """
    return sorted(set(backends), key=lambda b: (-rendezvous_score(key, b), b))


def load_cap(total_active: int, n_backends: int, factor: float) -> int:
    """The most sessions a backend may hold before a new one is placed.

    ``ceil(factor * (total_active + 1) / n_backends)``, computed exactly (a float product
    such as ``1.1 * 10`` would round up to a spurious extra slot).
    """
    if n_backends <= 0:
        raise ValueError("n_backends must be positive")
    if total_active < 0:
        raise ValueError("total_active must be non-negative")
    if factor < 1:
        raise ValueError("factor must be >= 1")
    exact = Fraction(factor).limit_denominator(1_000_000) * (total_active + 1) / n_backends
    return max(1, math.ceil(exact))


def pick_backend(
    key: str,
    backends: Collection[str],
    loads: Mapping[str, int],
    factor: float,
) -> str:
    """The backend a new group ``key`` is pinned to.

    ``backends`` are the candidates (the healthy ones); ``loads`` their active session
    counts (missing means 0; entries for other backends are ignored). Some candidate is
    always below the cap, because the least loaded holds at most the mean.
    """
    if not backends:
        raise ValueError("no candidate backends")
    order = rendezvous_order(key, backends)
    total = sum(max(0, loads.get(b, 0)) for b in order)
    cap = load_cap(total, len(order), factor)
    for backend in order:
        if loads.get(backend, 0) < cap:
            return backend
    raise AssertionError("unreachable: the least loaded backend is always under the cap")


class _Pin:
    __slots__ = ("backend", "sessions")

    def __init__(self) -> None:
        self.backend: str | None = None
        self.sessions = 0


class PinTable:
    """Which backend each group is pinned to, and how many open sessions each group holds.

    A group is pinned lazily, on its first :meth:`resolve`, and stays pinned while it has
    open sessions and its backend is healthy: a backend that recovers takes new groups, it
    does not pull pinned ones back. Thread-safe: the sync client may be shared by threads.
    """

    def __init__(self, load_factor: float = 1.25) -> None:
        if load_factor < 1:
            raise ValueError("load_factor must be >= 1")
        self._factor = load_factor
        self._pins: dict[str, _Pin] = {}
        # Open sessions per backend, kept in step with the pins: resolve() is on every
        # call's path and must not walk every group.
        self._loads: dict[str, int] = {}
        self._lock = threading.Lock()

    def register(self, group: str) -> None:
        """Count one more open session of ``group``."""
        with self._lock:
            pin = self._pins.setdefault(group, _Pin())
            pin.sessions += 1
            if pin.backend is not None:
                self._add_load(pin.backend, 1)

    def unregister(self, group: str) -> None:
        """Count one session of ``group`` fewer; the pin is forgotten with its last session."""
        with self._lock:
            pin = self._pins.get(group)
            if pin is None:
                return
            pin.sessions -= 1
            if pin.backend is not None:
                self._add_load(pin.backend, -1)
            if pin.sessions <= 0:
                del self._pins[group]

    def resolve(self, group: str, healthy: Sequence[str]) -> str:
        """The backend of ``group``: its pin if that is healthy, else a new pin.

        Re-pinning moves the whole group (all its open sessions) and counts the group's own
        sessions out of the loads, so a group never competes with itself.
        """
        if not healthy:
            raise ValueError("no healthy backend to resolve to")
        with self._lock:
            pin = self._pins.setdefault(group, _Pin())
            if pin.sessions <= 0:
                # resolve() without register(): a one-off call, count it as one session.
                pin.sessions = 1
            if pin.backend is not None and pin.backend in healthy:
                return pin.backend
            if pin.backend is not None:
                # Count the group's own sessions out: a group never competes with itself.
                self._add_load(pin.backend, -pin.sessions)
            pin.backend = pick_backend(group, healthy, self._loads, self._factor)
            self._add_load(pin.backend, pin.sessions)
            return pin.backend

    def backend_of(self, group: str) -> str | None:
        """The backend ``group`` is pinned to, or None when it is not pinned."""
        with self._lock:
            pin = self._pins.get(group)
            return None if pin is None else pin.backend

    def loads(self) -> dict[str, int]:
        """Open sessions per backend, over pinned groups."""
        with self._lock:
            return dict(self._loads)

    def _add_load(self, backend: str, delta: int) -> None:
        n = self._loads.get(backend, 0) + delta
        if n > 0:
            self._loads[backend] = n
        else:
            self._loads.pop(backend, None)
