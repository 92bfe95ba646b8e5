"""Choosing a backend per call: agentspec's public router, told what openai's errors mean.

A LangChain model has no "session open/close" events, only calls. So each group (or
session without a group) seen counts as one open session of the router until it falls out
of a bounded LRU (``max_groups``); that keeps the bounded-load placement meaningful and the
memory bounded for a process that serves millions of threads.

A backend is marked down when a call to it fails to connect, times out or answers 5xx.
There is no background prober: after ``cooldown_s`` a down backend becomes a candidate
again and the next call that lands there is the probe (a half-open circuit breaker). Pinned
groups never move back to a recovered backend — their draft index now lives elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import openai

from agentspec.client import (
    BackendRouter,
    Failure,
    FailureKind,
    RetryPolicy,
    normalise_backend,
    parse_retry_after,
)

__all__ = [
    "classify_failure",
    "is_backend_failure",
    "make_router",
    "normalise_backend",
    "retry_policy",
]

# How many groups routed by calls (no session lifecycle) the router remembers.
MAX_GROUPS = 10_000


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps: langchain-openai re-raises openai's errors in its own types."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in out):
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


def is_backend_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) says the backend, not the request, failed.

    Connection errors, timeouts and 5xx count; 4xx (a bad request, a refused seed) and 429
    (busy, not down) do not.
    """
    for current in _causes(exc):
        if isinstance(current, openai.APIConnectionError):  # timeouts included
            return True
        if isinstance(current, openai.APIStatusError) and current.status_code >= 500:
            return True
    return False


def classify_failure(exc: BaseException, backend: str) -> Failure:
    """What an exception of one attempt means to agentspec's retry machine."""
    if is_backend_failure(exc):
        return Failure(FailureKind.BACKEND, exc)
    for current in _causes(exc):
        if isinstance(current, openai.APIStatusError) and current.status_code == 429:
            retry_after = parse_retry_after(current.response.headers, time.time())
            return Failure(FailureKind.BUSY, exc, retry_after_s=retry_after)
    return Failure(FailureKind.REFUSED, exc)


def make_router(backends: Sequence[str], *, load_factor: float, cooldown_s: float) -> BackendRouter:
    """The router of a model with several backends."""
    return BackendRouter(backends, load_factor=load_factor, cooldown_s=cooldown_s, max_groups=MAX_GROUPS)


def retry_policy(n_backends: int) -> RetryPolicy:
    """Each backend at most once per call, without waiting: the openai client's own
    ``max_retries`` already retries one backend (429s included, honouring Retry-After)."""
    return RetryPolicy(
        max_attempts=max(1, min(n_backends, 20)),
        backoff_initial_s=0.0,
        backoff_max_s=0.0,
        retry_on_429=False,
    )
