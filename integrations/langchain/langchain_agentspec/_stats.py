"""A session's statistics, read by ``ChatAgentSpec`` (``GET /agentspec/v1/sessions/{id}``).

The request, its headers and the reading of the answer are agentspec's protocol layer
(:mod:`agentspec.client.protocol`); this module adds only what the model knows: its key,
its default headers, where the session's calls went, and the timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import httpx
from pydantic import SecretStr

from agentspec.client import SessionStats, protocol

__all__ = ["NO_KEY", "StatsClient", "stats_headers"]

#: The key sent when none is configured: vLLM accepts any key unless started with
#: ``--api-key``, and the OpenAI SDK insists on one.
NO_KEY: Final = "EMPTY"


def stats_headers(default_headers: Mapping[str, str] | None, api_key: Any) -> dict[str, str]:
    """The model's own headers plus its key as a bearer token.

    A callable key (a token provider) is left to the OpenAI client: statistics send none.
    """
    headers = dict(default_headers or {})
    secret = api_key.get_secret_value() if isinstance(api_key, SecretStr) else None
    if secret and secret != NO_KEY:
        headers["Authorization"] = f"Bearer {secret}"
    return headers


class StatsClient:
    """Reads one session's statistics from the backend its calls went to.

    A short-lived HTTP client per read (statistics are read rarely); the routing headers
    name the session and group, so a router in front takes the read to the server that
    holds the session.
    """

    def __init__(self, *, headers: Mapping[str, str], timeout_s: float) -> None:
        self.headers = dict(headers)
        self.timeout_s = timeout_s

    def _headers(self, session_id: str, group_id: str | None) -> dict[str, str]:
        return protocol.session_headers(session_id, group_id, self.headers)

    def get(self, backend: str, session_id: str, group_id: str | None = None) -> SessionStats:
        """The session's statistics; raises as :func:`agentspec.client.protocol.fetch_session_stats`."""
        with httpx.Client(timeout=self.timeout_s) as http:
            return protocol.fetch_session_stats(http, backend, session_id, headers=self._headers(session_id, group_id))

    async def aget(self, backend: str, session_id: str, group_id: str | None = None) -> SessionStats:
        """Async twin of :meth:`get`."""
        async with httpx.AsyncClient(timeout=self.timeout_s) as http:
            headers = self._headers(session_id, group_id)
            return await protocol.afetch_session_stats(http, backend, session_id, headers=headers)
