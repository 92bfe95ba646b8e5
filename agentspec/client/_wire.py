"""Sans-I/O helpers shared by the sync and async clients: ids, request bodies, response
classification, and the server-sent-events stream of a chat completion."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import httpx

from agentspec.wire import (
    GROUP_HEADER,
    SEEDS_FIELD,
    SESSION_HEADER,
    XARG_GROUP,
    XARG_SESSION,
    XARGS_FIELD,
    is_valid_id,
)

from .errors import (
    BackendUnavailableError,
    InvalidIdError,
    ServerRefusedError,
    SessionNotFoundError,
)


def check_id(field: str, value: object) -> str:
    """Return ``value`` when it is a valid wire id, else raise :class:`InvalidIdError`."""
    if not is_valid_id(value):
        raise InvalidIdError(field, value)
    return value


def new_session_id() -> str:
    """A fresh session id: random, so two processes never collide."""
    return f"sess-{uuid.uuid4().hex}"


def request_headers(
    session_id: str,
    group_id: str,
    base: Mapping[str, str],
    extra: Mapping[str, str] | None,
) -> dict[str, str]:
    headers = dict(base)
    if extra:
        headers.update(extra)
    # The ids go last: a caller's header must not split one session across routers.
    headers[SESSION_HEADER] = session_id
    headers[GROUP_HEADER] = group_id
    return headers


def request_body(
    params: Mapping[str, Any],
    *,
    session_id: str,
    group_id: str,
    seeds: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The JSON body: the caller's params, the ids in ``vllm_xargs``, and any seeds."""
    # None means "not given" (as in the OpenAI SDK): leave the server default.
    body = {k: v for k, v in params.items() if v is not None}
    extra_body = body.pop("extra_body", None)
    if extra_body:
        body.update(extra_body)
    xargs = dict(body.get(XARGS_FIELD) or {})
    xargs[XARG_SESSION] = session_id
    xargs[XARG_GROUP] = group_id
    body[XARGS_FIELD] = xargs
    if seeds:
        body[SEEDS_FIELD] = list(body.get(SEEDS_FIELD) or []) + list(seeds)
    return body


def error_message(response: httpx.Response) -> tuple[str, Any]:
    """The server's explanation of an error response, and the parsed body."""
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        text = response.text.strip()
        return (text or response.reason_phrase or "no message"), text
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            return err["message"], body
        if isinstance(err, str):
            return err, body
        for key in ("message", "detail"):
            if isinstance(body.get(key), str):
                return body[key], body
    return json.dumps(body)[:500], body


class TooManyRequests(Exception):
    """429: retry the same backend later; it is not down."""


def classify(response: httpx.Response, backend: str, *, stats: bool = False) -> None:
    """Raise for a response that is not a success.

    5xx → :class:`BackendUnavailableError` (fail over); 429 → :class:`TooManyRequests`;
    other 4xx → :class:`ServerRefusedError` with the server's message (404 on the stats
    endpoint → :class:`SessionNotFoundError`). The response body must have been read.
    """
    code = response.status_code
    if 200 <= code < 300:
        return
    message, body = error_message(response)
    if code >= 500:
        raise BackendUnavailableError(backend, f"{code}: {message}", status_code=code)
    if code == 429:
        raise TooManyRequests(message)
    if stats and code == 404:
        raise SessionNotFoundError(code, message, backend=backend, body=body)
    raise ServerRefusedError(code, message, backend=backend, body=body)


DONE: Final = object()


def parse_sse_line(line: str) -> dict[str, Any] | object | None:
    """One line of an SSE stream: a JSON event, :data:`DONE`, or None (comment, blank, field)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data:
        return None
    if data == "[DONE]":
        return DONE
    event = json.loads(data)
    return event if isinstance(event, dict) else None


class ChatAccumulator:
    """Rebuilds the first choice's message from streamed chat-completion chunks."""

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.chunks = 0
        self.last_chunk: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(self.content)

    @staticmethod
    def carries_output(chunk: Mapping[str, Any]) -> bool:
        """Whether the chunk holds anything beyond a role header.

        A stream's first chunk is usually ``{"role": "assistant", "content": ""}``; holding such
        chunks back until real output arrives lets a failure before the first token be retried
        transparently.
        """
        if chunk.get("usage"):
            return True
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason"):
                return True
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                return True
            if delta.get("reasoning"):
                return True
        return False

    def feed(self, chunk: Mapping[str, Any]) -> None:
        self.chunks += 1
        self.last_chunk = dict(chunk)
        if chunk.get("usage"):
            self.usage = dict(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("role"), str):
                self.role = delta["role"]
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str):
                self.reasoning.append(reasoning)
            for call in delta.get("tool_calls") or ():
                slot = self.tool_calls.setdefault(
                    int(call.get("index", len(self.tool_calls))),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        return msg


def first_choice(body: Mapping[str, Any], backend: str) -> Mapping[str, Any]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise BackendUnavailableError(backend, "response has no choices")
    return choices[0]
