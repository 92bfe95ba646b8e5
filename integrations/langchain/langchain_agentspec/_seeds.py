"""Seeds waiting for their session's next request.

A seed reaches the server only inside a request (``agentspec_seeds``, docs/wire.md), so
the model keeps them per session until that session's next call takes them. The book is
owned by one model instance (no module state) and bounded: a session that never calls
again cannot hold memory forever.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from agentspec.client import Seed, protocol

__all__ = ["SeedBook"]

logger = logging.getLogger(__name__)


class SeedBook:
    """Pending seeds per session, in the order given. Thread-safe."""

    def __init__(self, *, max_per_session: int = 16, max_sessions: int = 1024) -> None:
        self._max_per_session = max_per_session
        self._max_sessions = max_sessions
        self._pending: OrderedDict[str, list[Seed]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, session_id: str, seeds: Sequence[Seed]) -> None:
        """Queue ``seeds``; :class:`ValueError` past the server's per-request seed limit."""
        with self._lock:
            queue = self._pending.get(session_id, [])
            if len(queue) + len(seeds) > self._max_per_session:
                msg = (
                    f"session {session_id!r} would hold {len(queue) + len(seeds)} pending seeds; "
                    f"the server takes at most {self._max_per_session} per request"
                )
                raise ValueError(msg)
            self._pending[session_id] = [*queue, *seeds]
            self._pending.move_to_end(session_id)
            while len(self._pending) > self._max_sessions:
                dropped, lost = self._pending.popitem(last=False)
                logger.warning("agentspec: dropped %d pending seed(s) of idle session %r", len(lost), dropped)

    def take(self, session_id: str) -> list[Seed]:
        """Remove and return the session's pending seeds (a call is about to send them)."""
        with self._lock:
            return self._pending.pop(session_id, [])

    def restore(self, session_id: str, seeds: Sequence[Seed]) -> None:
        """Put back seeds a failed call did not deliver, ahead of any added meanwhile."""
        if not seeds:
            return
        with self._lock:
            later = self._pending.get(session_id, [])
            self._pending[session_id] = [*seeds, *later]

    def peek(self, session_id: str) -> list[Seed]:
        with self._lock:
            return list(self._pending.get(session_id, []))

    def discard(self, session_id: str) -> int:
        """Drop the session's pending seeds; how many were dropped."""
        with self._lock:
            return len(self._pending.pop(session_id, []))

    @staticmethod
    def wire(seeds: Sequence[Seed]) -> list[dict[str, Any]]:
        """The seeds as entries of ``agentspec_seeds``."""
        return protocol.seeds_field(seeds)
