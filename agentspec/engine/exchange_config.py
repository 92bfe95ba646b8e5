"""Where the Redis transport of the corpus exchange connects, and how much it keeps:
``--agentspec-exchange redis://host:port/db?stream=NAME&...`` parsed and checked where
the server starts (no numpy, no Redis client needed for that)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["REDIS_SCHEMES", "RedisExchangeConfig", "redacted"]

REDIS_SCHEMES = ("redis", "rediss", "unix")


class RedisExchangeConfig(BaseModel):
    """Where and how much: parsed from ``redis://host:port/db?stream=NAME&...``.

    The query parameters ``stream``, ``max_entries``, ``max_age_s`` and ``catch_up_entries``
    are agentspec's; any other goes to the Redis client (e.g. ``socket_timeout``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(..., description="The Redis URL without agentspec's parameters.")
    stream: str | None = Field(None, min_length=1, description="The stream's key. None: one per model fingerprint.")
    max_entries: int = Field(100_000, ge=1, description="Entries the stream keeps (approximately).")
    max_age_s: float = Field(3600.0, gt=0, description="Entries older than this are trimmed and not taken in.")
    catch_up_entries: int = Field(
        20_000, ge=0, description="Entries a starting replica reads back from the retained window at most."
    )

    @classmethod
    def parse(cls, url: str) -> RedisExchangeConfig:
        """Raises ``ValueError`` naming what is wrong with ``url``."""
        parts = urlsplit(url)
        if parts.scheme not in REDIS_SCHEMES:
            raise ValueError(
                f"the exchange URL must start with {', '.join(s + '://' for s in REDIS_SCHEMES)}, got {redacted(url)!r}"
            )
        if parts.scheme != "unix" and not parts.hostname:
            raise ValueError(f"the exchange URL names no host: {redacted(url)!r}")
        ours: dict[str, Any] = {}
        rest = []
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in ("stream", "max_entries", "max_age_s", "catch_up_entries"):
                ours[key] = value
            else:
                rest.append((key, value))
        try:
            return cls(url=urlunsplit(parts._replace(query=urlencode(rest))), **ours)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ValueError(f"exchange URL parameter {'.'.join(map(str, err['loc']))}: {err['msg']}") from None

    def stream_for(self, model: str) -> str:
        """The stream's key for replicas of ``model`` (a fingerprint)."""
        return self.stream or f"agentspec:exchange:{model}"


def redacted(url: str) -> str:
    """``url`` without its password, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
