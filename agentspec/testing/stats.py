"""Reading a server's per-session statistics in tests (``GET /agentspec/v1/sessions/<id>``)."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import httpx

from agentspec import wire

__all__ = ["session_stats"]


def session_stats(base: str, session_id: str, *, wait: bool = True, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The session's statistics on the server at ``base``, or None when it holds none.

    ``wait``: the engine publishes statistics a moment after each step, so a session that
    has just run may not be there yet: ask again for up to ``timeout_s``. Without it, one
    answer (for checking that a server does *not* hold a session).
    """
    url = f"{base}{wire.SESSION_STATS_PATH}{quote(session_id, safe='')}"
    deadline = time.monotonic() + (timeout_s if wait else 0.0)
    while True:
        r = httpx.get(url, timeout=10)
        if r.status_code != 404:
            return dict(r.raise_for_status().json())
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)
