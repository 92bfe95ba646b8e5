"""What every transport of the corpus exchange has in common: the interface the proposer
calls, and the record it hands over."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["TENANT_ID", "Exchange", "PeerOutput"]

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

    def close(self) -> None:
        """Release the transport's files, connections and threads."""
        ...
