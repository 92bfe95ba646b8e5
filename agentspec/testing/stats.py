"""Reading a server's statistics in tests: one session's (``GET /agentspec/v1/sessions/<id>``)
and Prometheus samples of ``/metrics``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from agentspec.client import SessionNotFoundError, protocol

__all__ = ["metric_value", "scrape", "session_stats"]


def session_stats(
    base: str,
    session_id: str,
    *,
    wait: bool = True,
    timeout_s: float = 10.0,
    until: Callable[[dict[str, Any]], bool] | None = None,
    headers: Mapping[str, str] | None = None,
    cache_salt: str | None = None,
) -> dict[str, Any] | None:
    """The session's statistics on the server at ``base`` (the JSON object it answered),
    or None when it holds none.

    ``wait``: the engine publishes statistics a moment after each step, so a session that
    has just run may not be there yet, or not with its last call: ask again for up to
    ``timeout_s`` until it is there and ``until(stats)`` holds (then the last answer is
    returned, whether it holds or not). Without it, one answer (for checking that a server
    does *not* hold a session). ``headers`` (an API key) and ``cache_salt`` pick the tenant,
    as for :func:`agentspec.client.protocol.session_stats_request`. Any answer but the
    statistics or a 404 raises as :func:`agentspec.client.protocol.check_response` does.
    """
    request = protocol.session_stats_request(base, session_id, headers=headers, cache_salt=cache_salt)
    deadline = time.monotonic() + (timeout_s if wait else 0.0)
    stats: dict[str, Any] | None = None
    with httpx.Client(timeout=10) as http:
        while True:
            response = http.get(request.url, params=request.params, headers=request.headers)
            try:
                stats = dict(protocol.response_json(response, base, session_id=session_id))
            except SessionNotFoundError:
                pass
            else:
                if until is None or until(stats):
                    return stats
            if time.monotonic() >= deadline:
                return stats
            time.sleep(0.2)


def scrape(base: str) -> str:
    """The server's ``/metrics`` text."""
    return httpx.get(base + "/metrics", timeout=10).raise_for_status().text


def metric_value(text: str, name: str, labels: str = "") -> float:
    """The sum of a Prometheus series' samples whose labels contain every ``k="v"`` of
    ``labels`` (comma-separated), e.g. ``metric_value(t, "agentspec_drafts_total", 'level="call"')``.
    Raises ``KeyError`` when there is none."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        metric, _, rest = key.partition("{")
        if metric == name and all(part in rest for part in labels.split(",") if part):
            total += float(value)
            found = True
    if not found:
        raise KeyError(f"{name}{{{labels}}} not in /metrics")
    return total
