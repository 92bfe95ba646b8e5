"""Result types: what a session returns and records."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["ChatResult", "SeedReceipt", "SessionStats", "TokenCompletion", "Turn"]


@dataclasses.dataclass(frozen=True)
class Turn:
    """One completed call of a session, as recorded in ``session.turns``.

    Chat turns fill ``messages``/``message``; token turns fill ``prompt_token_ids``/
    ``output_token_ids``. ``backend`` is the server that produced the output; ``attempts``
    counts tries (more than one when the call failed over).
    """

    index: int
    kind: Literal["chat", "tokens"]
    backend: str
    attempts: int
    text: str
    finish_reason: str | None
    streamed: bool = False
    messages: tuple[dict[str, Any], ...] | None = None
    message: dict[str, Any] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    output_token_ids: tuple[int, ...] | None = None
    usage: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class ChatResult:
    """A chat completion: the first choice's message, plus the raw response."""

    message: dict[str, Any]
    """``{"role": "assistant", "content": ..., "tool_calls": [...]}`` as the server sent it."""
    finish_reason: str | None
    usage: dict[str, Any] | None
    backend: str
    raw: dict[str, Any]
    """The whole response body (all choices, ids, vLLM extras)."""
    turn: Turn

    @property
    def content(self) -> str | None:
        content = self.message.get("content")
        return content if isinstance(content, str) else None

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or [])


@dataclasses.dataclass(frozen=True)
class TokenCompletion:
    """A token-in/token-out completion (vLLM ``/v1/completions`` with a token-id prompt)."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None
    prompt_token_ids: tuple[int, ...] | None
    logprobs: tuple[float | None, ...] | None
    """Per generated token, when ``logprobs`` was requested."""
    top_logprobs: tuple[dict[str, float] | None, ...] | None
    usage: dict[str, Any] | None
    backend: str
    raw: dict[str, Any]
    turn: Turn


class SessionStats(BaseModel):
    """``GET /agentspec/v1/sessions/{id}``: the server's view of one session."""

    model_config = ConfigDict(extra="allow", frozen=True)

    session_id: str
    group_id: str | None = None
    calls: int = 0
    draft_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    acceptance_rate: float | None = None
    indexed_tokens: int = 0
    seeded_tokens: int = 0
    last_index_new_tokens: int = 0
    held_tokens: int = 0
    accepted_tokens_by_level: dict[str, int] = {}
    """Accepted draft tokens by the level that drafted them: call, session, group, global."""
    seeded_tokens_by_kind: dict[str, int] = {}
    """Seeded tokens by seed kind: prior_turn, repair_attempt, sibling_output, document."""
    policy_version: int | None = None
    """RL: the policy version the session's latest call ran under (None: none announced)."""
    draft_tokens_by_policy_version: dict[str, int] = {}
    accepted_tokens_by_policy_version: dict[str, int] = {}
    """Draft and accepted tokens by the policy version they ran under (keys: the version)."""
    model_draft_steps: int = 0
    model_draft_tokens: int = 0
    model_accepted_tokens: int = 0
    """Hybrid drafting: the draft model's drafts for the session (the fields above count
    the draft index's)."""
    backend: str | None = None
    """Filled by the client: the backend that answered."""


class SeedReceipt(BaseModel):
    """``POST /agentspec/v1/seeds``: what the server took from a seed-only request."""

    model_config = ConfigDict(extra="allow", frozen=True)

    session_id: str | None = None
    group_id: str | None = None
    seeded_tokens: int = 0
    """Tokens the server accepted (its index may still refuse a seed over its own budget)."""
    backend: str | None = None
    """Filled by the client: the backend that took the seeds."""
