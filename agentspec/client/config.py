"""Client configuration: one pydantic model, validated once at construction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["ClientConfig", "RetryPolicy", "normalise_backend"]


def normalise_backend(url: str) -> str:
    """A backend base URL as agentspec spells it: no trailing ``/``, no ``/v1`` suffix.

    Raises ``ValueError`` unless it starts with ``http://`` or ``https://``.
    """
    url = url.strip().rstrip("/")
    url = url.removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"backend URL must start with http:// or https://: {url!r}")
    return url


class RetryPolicy(BaseModel):
    """How a failed call is retried (see docs/client.md, "Retries").

    A call is retried only while no output has reached the caller; a plain-text stream cut
    after output is resumed elsewhere from the tokens delivered (``resume_streams``). A
    request in flight to a backend that gets marked down is cancelled and retried at once.
    After a backend failure
    (connection error, timeout, 5xx) the retry goes to the session's pinned backend, which
    is then a different, healthy one; after a 429 to the same backend. Before each retry
    the client waits an exponential backoff with jitter, or what the server's
    ``Retry-After`` asks, up to ``retry_after_max_s``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(3, ge=1, le=20, description="Attempts per call, first included.")
    backoff_initial_s: float = Field(0.05, ge=0.0, description="Delay before the 2nd attempt.")
    backoff_max_s: float = Field(2.0, ge=0.0, description="Cap on the exponential delay.")
    backoff_multiplier: float = Field(2.0, ge=1.0)
    jitter: Literal["full", "decorrelated", "none"] = Field(
        "full",
        description="'full': uniform in [0, exponential delay]; 'decorrelated': uniform in "
        "[initial, 3 x the previous delay], capped; 'none': the exponential delay itself.",
    )
    retry_on_429: bool = Field(True, description="Retry 'too many requests' on the same backend (never marks it down).")
    resume_streams: bool = Field(
        True,
        description="Resume a stream cut after output on another backend, from the token ids "
        "already delivered (plain text streams only; see docs/client.md, 'Resumed streams').",
    )
    retry_after_max_s: float = Field(
        60.0,
        ge=0.0,
        description="Cap on a server's Retry-After (429, or 503 when the retry goes back to "
        "the same backend); a longer one is waited for this long.",
    )

    @model_validator(mode="after")
    def _check_backoff(self) -> RetryPolicy:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError("backoff_initial_s must not exceed backoff_max_s")
        return self

    def delay(self, attempt: int) -> float:
        """The exponential delay before attempt number ``attempt`` (2 for the first retry),
        without jitter: the ceiling of :meth:`backoff` with full jitter."""
        if attempt <= 1:
            return 0.0
        # The exponent is bounded: max_attempts is at most 20.
        return min(self.backoff_max_s, self.backoff_initial_s * self.backoff_multiplier ** (attempt - 2))

    def backoff(self, attempt: int, uniform: Callable[[], float], previous: float | None = None) -> float:
        """The jittered delay before attempt ``attempt``, always in ``[0, backoff_max_s]``.

        ``uniform()`` returns a number in ``[0, 1)`` (``random.random``); ``previous`` is the
        delay before the previous retry (decorrelated jitter grows from it).
        """
        if attempt <= 1:
            return 0.0
        if self.jitter == "none":
            return self.delay(attempt)
        if self.jitter == "full":
            return self.delay(attempt) * uniform()
        low = self.backoff_initial_s
        high = max(low, 3.0 * (previous if previous is not None else low))
        return min(self.backoff_max_s, low + (high - low) * uniform())


class ClientConfig(BaseModel):
    """Configuration of :class:`~agentspec.client.AgentSpecClient` and its async twin.

    ``backends`` are OpenAI-compatible base URLs *without* the ``/v1`` suffix
    (``http://host:8000``); a trailing ``/v1`` is accepted and stripped. One URL may be a
    router (vllm-router, production-stack) that spreads sessions over many servers.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backends: tuple[str, ...] = Field(..., min_length=1)
    api_key: str | None = Field(None, description="Sent as 'Authorization: Bearer <key>'.")
    model: str | None = Field(None, description="Default model name; a call's own `model` wins. Required by vLLM.")
    connect_timeout_s: float = Field(5.0, gt=0)
    read_timeout_s: float | None = Field(600.0, gt=0, description="Per read; generations can be long. None: no limit.")
    health_timeout_s: float = Field(2.0, gt=0)
    health_check_interval_s: float | None = Field(
        10.0,
        gt=0,
        description="Period of the background /health probe; None disables it (failures "
        "seen by calls still mark a backend down).",
    )
    retry: RetryPolicy = RetryPolicy()  # frozen: one shared default is safe
    load_factor: float = Field(
        1.25,
        ge=1.0,
        description="Bounded-load factor: no backend takes more than ceil(factor * (active+1) / n) "
        "sessions when a new group is pinned.",
    )
    history_max_chars: int = Field(32_000, ge=0, description="Text budget of a session's history kept for re-seeding.")
    history_max_tokens: int = Field(
        8_192, ge=0, description="Token-id budget of a session's history kept for re-seeding."
    )
    max_seeds_per_request: int = Field(
        16, ge=1, description="The server's limit on seeds per request (wire default: 16)."
    )
    default_headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("backends", mode="before")
    @classmethod
    def _coerce_backends(cls, value: object) -> object:
        if isinstance(value, str):
            return (value,)
        return value

    @field_validator("backends")
    @classmethod
    def _normalise_backends(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        out: list[str] = []
        for url in map(normalise_backend, value):
            # Order matters nowhere (rendezvous hashing is order-free), duplicates would
            # double a backend's share: drop them.
            if url not in out:
                out.append(url)
        return tuple(out)
