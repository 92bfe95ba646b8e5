"""The agentspec endpoints an OpenHands ``LLM`` talks to: seeds and session statistics.

An OpenHands ``LLM`` already knows where its server is (``base_url``), how to
authenticate (``api_key``) and, when built by :func:`~openhands_agentspec.agentspec_llm`,
which routing key pins it (``X-Session-Id`` in ``extra_headers``). Seeds and statistics
reuse all three, so behind vllm-router they reach the server that holds the session.
Seeding is advice to the drafter: a seed that cannot be delivered is logged and kept for
the next delivery (bounded), never raised into the agent.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from openhands.sdk import LLM
from pydantic import SecretStr

from agentspec import wire
from agentspec.client import AgentSpecClientError, Seed, ServerRefusedError, SessionStats, protocol

__all__ = ["SeedPoster", "endpoint_root", "fetch_stats", "llm_headers", "split_seeds"]

logger = logging.getLogger(__name__)

#: Seeds kept for a later delivery when the server could not be reached.
MAX_PENDING_SEEDS = 64
#: Characters of seed text per request: well under the server's default token limit per
#: request (``wire.MAX_SEED_TOKENS_PER_REQUEST``) for any tokenizer of 2+ characters a token.
MAX_SEED_CHARS_PER_REQUEST = 48_000


def split_seeds(seeds: Sequence[Seed], max_chars: int = MAX_SEED_CHARS_PER_REQUEST) -> list[list[Seed]]:
    """Seeds in request-sized batches: at most ``wire.MAX_SEEDS_PER_REQUEST`` seeds and
    ``max_chars`` characters each; a longer text is cut into pieces that fit."""
    pieces: list[Seed] = []
    for seed in seeds:
        text = seed.text
        if text is None or len(text) <= max_chars:
            pieces.append(seed)
            continue
        pieces += [Seed.of(text[i : i + max_chars], seed.kind, seed.scope) for i in range(0, len(text), max_chars)]
    batches: list[list[Seed]] = []
    size = 0
    for seed in pieces:
        length = len(seed.text) if seed.text is not None else 0
        if not batches or len(batches[-1]) == wire.MAX_SEEDS_PER_REQUEST or size + length > max_chars:
            batches.append([])
            size = 0
        batches[-1].append(seed)
        size += length
    return batches


def endpoint_root(base_url: str) -> str:
    """``http://host:port`` from an OpenAI base URL (``.../v1`` or the bare root)."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


def llm_headers(llm: LLM) -> dict[str, str]:
    """The headers the LLM's own calls carry that agentspec requests need too."""
    headers = dict(llm.extra_headers or {})
    key = llm.api_key
    secret = key.get_secret_value() if isinstance(key, SecretStr) else key
    if isinstance(secret, str) and secret:
        headers["Authorization"] = f"Bearer {secret}"
    return headers


def _llm_root(llm: LLM) -> str:
    if not llm.base_url:
        raise ValueError("the LLM has no base_url: agentspec needs the server's (or router's) address")
    return endpoint_root(llm.base_url)


def fetch_stats(llm: LLM, session_id: str, *, timeout_s: float = 10.0) -> SessionStats:
    """The server's draft statistics of one session (an OpenHands conversation id).

    The request carries the LLM's own headers (its key and routing header), so behind a
    router it reaches the server that holds the session.

    Raises:
        SessionNotFoundError: the server holds no state for it (no call yet, or the
            session was evicted).
        AuthenticationError: the server refused the LLM's key.
        ServerRefusedError: any other 4xx.
        BackendUnavailableError: the server could not be reached, or answered 5xx.
    """
    with httpx.Client(timeout=timeout_s) as http:
        return protocol.fetch_session_stats(http, _llm_root(llm), session_id, headers=llm_headers(llm))


class SeedPoster:
    """Delivers seeds for sessions with seed-only requests (``POST /agentspec/v1/seeds``).

    Thread-safe. Undelivered seeds wait (at most :data:`MAX_PENDING_SEEDS`, oldest dropped
    first) and go out with the session's next delivery.
    """

    def __init__(self, *, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self._pending: dict[str, deque[Seed]] = {}
        self._lock = threading.Lock()
        self.delivered_tokens = 0
        self.failures = 0

    def send(
        self,
        llm: LLM,
        session_id: str,
        seeds: Sequence[Seed],
        *,
        group_id: str | None = None,
    ) -> int:
        """Deliver ``seeds`` (and any still pending) to the session; tokens the server seeded.

        Returns 0 when nothing could be delivered (the seeds stay pending).
        """
        batches = split_seeds(self._queue(session_id, seeds))
        seeded = 0
        for n, batch in enumerate(batches):
            try:
                seeded += self._post(llm, session_id, group_id, batch)
            except (httpx.HTTPError, AgentSpecClientError, ValueError) as exc:
                self.failures += 1
                logger.warning(
                    "agentspec: could not seed session %r (%s); will retry",
                    session_id,
                    exc,
                )
                self._requeue(session_id, [seed for later in batches[n:] for seed in later])
                break
        self.delivered_tokens += seeded
        return seeded

    def pending(self, session_id: str) -> int:
        with self._lock:
            return len(self._pending.get(session_id, ()))

    def _queue(self, session_id: str, seeds: Sequence[Seed]) -> list[Seed]:
        with self._lock:
            queue = self._pending.pop(session_id, deque())
            queue.extend(seeds)
            return list(queue)[-MAX_PENDING_SEEDS:]

    def _requeue(self, session_id: str, seeds: Sequence[Seed]) -> None:
        with self._lock:
            later = self._pending.pop(session_id, deque())
            self._pending[session_id] = deque([*seeds, *later][-MAX_PENDING_SEEDS:])

    def _post(self, llm: LLM, session_id: str, group_id: str | None, seeds: Sequence[Seed]) -> int:
        root = _llm_root(llm)
        body = protocol.seeds_request_body(session_id, seeds, group_id=group_id)
        response = httpx.post(root + wire.SEEDS_PATH, json=body, headers=llm_headers(llm), timeout=self.timeout_s)
        try:
            data: Mapping[str, Any] = protocol.response_json(response, root)
        except ServerRefusedError as exc:
            if exc.status_code in (408, 429):
                raise
            # Refused (a seed over the server's limits, a bad id): retrying cannot help.
            logger.warning("agentspec: server refused seeds for %r: %s", session_id, exc.message[:300])
            return 0
        return int(data.get("seeded_tokens", 0))
