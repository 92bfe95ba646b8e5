"""What every transport of the corpus exchange has in common: the interface the proposer
calls, and the record it hands over."""

from __future__ import annotations

import multiprocessing.util
import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["TENANT_ID", "Exchange", "PeerOutput", "close_at_exit"]

#: What a tenant id looks like (agentspec.engine.tenancy makes them; the transports refuse others).
TENANT_ID = re.compile(r"[A-Za-z0-9._-]*")


@dataclass(frozen=True, slots=True)
class PeerOutput:
    """One finished output another replica published."""

    tokens: np.ndarray  # int32
    #: The policy version it was generated under (None: none had been announced).
    policy_version: int | None = None


class Exchange(Protocol):
    """One replica's end of the exchange, owned by the engine's thread.

    Both calls are cheap and never raise: a transport that cannot reach its medium logs,
    counts and keeps the replica drafting from its own text.
    """

    def publish(
        self, tokens: np.ndarray, tenant: str = "", policy_version: int | None = None, group: str | None = None
    ) -> bool:
        """Hand one finished output of ``tenant`` to the other replicas. Returns whether the
        transport took it (written, or queued for sending)."""
        ...

    def poll(self) -> list[tuple[str, PeerOutput]]:
        """``(tenant, output)`` of the other replicas' outputs that arrived since the last
        poll, a bounded number per call."""
        ...

    def counters(self) -> dict[str, float]:
        """The transport's own counters and gauges (``exchange_*``), for the statistics."""
        ...

    def close(self, timeout: float = 2.0) -> None:
        """Send what is still queued, for ``timeout`` seconds at most, then release the
        transport's files, connections and threads. Idempotent."""
        ...


#: Process-exit finalizers run from the highest priority down; the exchange's go early,
#: while the network and logging still work.
_EXIT_PRIORITY = 50


def close_at_exit(owner: object, exchange: Exchange, timeout: float = 2.0) -> None:
    """Close ``exchange`` (a bounded flush) when ``owner`` is collected or its process
    exits normally, whichever comes first.

    ``multiprocessing``'s finalizers, not ``atexit``: vLLM's engine processes are
    ``multiprocessing`` children, which, when forked, leave without running ``atexit``
    hooks but do run these (and the main process runs them from ``atexit``). A process
    that is killed runs neither: what it had queued is lost. vLLM 0.32 kills its engine
    processes at once unless the server has a ``--shutdown-timeout``.
    """
    multiprocessing.util.Finalize(owner, exchange.close, kwargs={"timeout": timeout}, exitpriority=_EXIT_PRIORITY)
