"""Session ids and seeds on the wire: an ASGI middleware for vLLM's OpenAI server.

Load it with ``--middleware agentspec.engine.middleware.SessionIdMiddleware`` (``agentspec
serve`` does). For generation requests it maps every form of session id the ecosystem
sends (docs/wire.md) to one internal form, ``vllm_xargs.session_id`` / ``group_id``, which
vLLM hands the engine as ``SamplingParams.extra_args``; validates and tokenizes
``agentspec_seeds`` and moves them into ``vllm_xargs`` (as JSON; vLLM refuses nested
objects there); and rewrites the rLLM-style path prefix ``/sessions/<id>/v1/...`` to
``/v1/...``. It also serves the proposer's statistics: ``GET /agentspec/v1/sessions/{id}``,
``GET /agentspec/v1/stats``, and the ``agentspec_*`` series appended to ``/metrics``.

A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``): it replays the rewritten
body once and then hands ``receive`` back to the app, so vLLM still sees the client
disconnect and aborts the request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from agentspec.engine.config import XARG_GROUP, XARG_SEEDS, XARG_SESSION, EngineSettings, load_settings
from agentspec.engine.metrics import SnapshotReader
from agentspec.index import SeedKind

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Ids: 1 to 128 characters of [A-Za-z0-9._:@/-] (docs/wire.md).
ID_PATTERN = re.compile(r"[A-Za-z0-9._:@/-]{1,128}")
_SESSION_PREFIX = re.compile(r"^/sessions/([^/]*)(/v1/.*)$")
_STATS_PATH = re.compile(r"^/agentspec/v1/sessions/(.+)$")

#: Endpoints whose body is an OpenAI-style generation request carrying ``vllm_xargs``.
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})

SEED_FIELDS = frozenset({"text", "token_ids", "scope", "kind"})
SEED_SCOPES = ("session", "group")
# A text seed's tokenizer bound before tokenizing: no tokenizer makes fewer than one token
# per 32 characters, so longer text is over the token limit anyway.
_CHARS_PER_TOKEN_BOUND = 32


class WireError(ValueError):
    """A request the server refuses (HTTP 400); ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class SessionIdMiddleware:
    """See the module docstring. ``settings`` default to the process's environment."""

    def __init__(self, app: ASGIApp, settings: EngineSettings | None = None) -> None:
        self.app = app
        self.settings = settings or load_settings()
        self.reader = SnapshotReader(Path(self.settings.state_dir)) if self.settings.state_dir else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        method: str = scope.get("method", "GET")

        if method == "GET" and (stats := _STATS_PATH.match(path)):
            await self._session_stats(stats.group(1), send)
            return
        if method == "GET" and path == "/agentspec/v1/stats":
            await self._summary(send)
            return
        if method == "GET" and path.rstrip("/") == "/metrics" and self.reader is not None:
            await self._metrics(scope, receive, send)
            return

        headers = _Headers(scope)
        path_session = None
        if prefixed := _SESSION_PREFIX.match(path):
            path_session, path = prefixed.group(1), prefixed.group(2)
            if not ID_PATTERN.fullmatch(path_session):
                await _send_error(send, _bad_id("URL /sessions/<id>/"))
                return
            scope = dict(scope, path=path, raw_path=path.encode())

        if method != "POST" or path not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return

        body = await _read_body(receive)
        try:
            new_body = await self._rewrite(scope, body, headers, path_session)
        except WireError as exc:
            await _send_error(send, exc)
            return
        if new_body is not body:
            scope = dict(scope, headers=_with_content_length(scope["headers"], len(new_body)))
        await self.app(scope, _replay(new_body, receive), send)

    # ------------------------------------------------------------------ generation requests

    async def _rewrite(self, scope: Scope, body: bytes, headers: _Headers, path_session: str | None) -> bytes:
        """The body with ids and seeds in ``vllm_xargs``; the same object when unchanged."""
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            # Not ours to judge: vLLM answers malformed JSON with its own 400. But an id
            # outside the body must still be valid.
            _resolve_ids({}, {}, headers, path_session)
            return body
        xargs = data.get("vllm_xargs")
        if xargs is None:
            xargs = {}
        if not isinstance(xargs, dict):
            return body  # vLLM refuses it with its own message
        if XARG_SEEDS in xargs:
            raise WireError(
                f"vllm_xargs.{XARG_SEEDS} is reserved; send seeds in the top-level field agentspec_seeds",
                f"vllm_xargs.{XARG_SEEDS}",
            )
        session_id, group_id = _resolve_ids(data, xargs, headers, path_session)
        raw_seeds = data.pop("agentspec_seeds", None)
        seeds = await self._seeds(scope, raw_seeds, session_id, group_id) if raw_seeds is not None else []

        if session_id is None and group_id is None and raw_seeds is None:
            return body
        if session_id is not None:
            xargs[XARG_SESSION] = session_id
        if group_id is not None:
            xargs[XARG_GROUP] = group_id
        if seeds:
            xargs[XARG_SEEDS] = json.dumps(seeds, separators=(",", ":"))
        data["vllm_xargs"] = xargs
        return json.dumps(data).encode()

    async def _seeds(
        self, scope: Scope, raw: Any, session_id: str | None, group_id: str | None
    ) -> list[dict[str, Any]]:
        """Validate ``agentspec_seeds``; return them as token ids (the internal form)."""
        limit_count = self.settings.max_seeds_per_request
        limit_tokens = self.settings.max_seed_tokens_per_request
        if not isinstance(raw, list):
            raise WireError("agentspec_seeds must be a list of seed objects", "agentspec_seeds")
        if len(raw) > limit_count:
            raise WireError(
                f"agentspec_seeds has {len(raw)} seeds, over the limit max_seeds_per_request={limit_count}",
                "agentspec_seeds",
            )
        state = _app_state(scope)
        out: list[dict[str, Any]] = []
        total = 0
        for i, seed in enumerate(raw):
            where = f"agentspec_seeds[{i}]"
            if not isinstance(seed, dict):
                raise WireError(f"{where} must be an object", where)
            unknown = sorted(set(seed) - SEED_FIELDS)
            if unknown:
                raise WireError(
                    f"{where} has unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(SEED_FIELDS))})",
                    f"{where}.{unknown[0]}",
                )
            scope_name = seed.get("scope", "session")
            if scope_name not in SEED_SCOPES:
                raise WireError(f"{where}.scope must be one of {', '.join(SEED_SCOPES)}", f"{where}.scope")
            if scope_name == "session" and session_id is None:
                raise WireError(f"{where} has scope session but the request names no session", f"{where}.scope")
            if scope_name == "group" and group_id is None and session_id is None:
                raise WireError(f"{where} has scope group but the request names no group or session", f"{where}.scope")
            kind = seed.get("kind", SeedKind.PRIOR_TURN.value)
            if kind not in {k.value for k in SeedKind}:
                allowed = ", ".join(k.value for k in SeedKind)
                raise WireError(f"{where}.kind must be one of {allowed}", f"{where}.kind")
            has_text, has_ids = "text" in seed, "token_ids" in seed
            if has_text == has_ids:
                raise WireError(f"{where} needs exactly one of text and token_ids", where)
            if has_text:
                text = seed["text"]
                if not isinstance(text, str):
                    raise WireError(f"{where}.text must be a string", f"{where}.text")
                if len(text) > _CHARS_PER_TOKEN_BOUND * limit_tokens:
                    raise _over_tokens(limit_tokens, where)
                token_ids = await _tokenize(state, text)
            else:
                token_ids = seed["token_ids"]
                vocab = _vocab_size(state)
                if not isinstance(token_ids, list) or not all(type(t) is int and 0 <= t < vocab for t in token_ids):
                    raise WireError(
                        f"{where}.token_ids must be a list of integers in [0, {vocab})", f"{where}.token_ids"
                    )
            total += len(token_ids)
            if total > limit_tokens:
                raise _over_tokens(limit_tokens, where)
            out.append({"token_ids": token_ids, "scope": scope_name, "kind": kind})
        return out

    # ------------------------------------------------------------------ statistics

    async def _session_stats(self, session_id: str, send: Send) -> None:
        if not ID_PATTERN.fullmatch(session_id):
            await _send_error(send, _bad_id("path session id"))
            return
        view = self.reader.session(session_id) if self.reader is not None else None
        if view is None:
            await _send_json(send, 404, _error_body(f"no state for session {session_id!r}", "NotFoundError", 404))
            return
        await _send_json(send, 200, view)

    async def _summary(self, send: Send) -> None:
        if self.reader is None:
            await _send_json(
                send, 404, _error_body("statistics are not published (no state_dir)", "NotFoundError", 404)
            )
            return
        await _send_json(send, 200, self.reader.summary())

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /metrics with the agentspec series appended."""
        assert self.reader is not None
        # Ask for an uncompressed answer so the two texts can be joined.
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"accept-encoding"]
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(dict(scope, headers=headers), receive, capture)
        if start is None:
            return
        body = b"".join(chunks)
        if start["status"] == 200:
            body = body + self.reader.prometheus_text()
        await send(dict(start, headers=_with_content_length(start.get("headers", []), len(body))))
        await send({"type": "http.response.body", "body": body, "more_body": False})


# ---------------------------------------------------------------------- helpers


class _Headers:
    def __init__(self, scope: Scope) -> None:
        self._h: dict[str, str] = {}
        for key, value in scope.get("headers", []):
            self._h.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))

    def get(self, name: str) -> str | None:
        return self._h.get(name.lower())


def _resolve_ids(
    data: dict[str, Any], xargs: dict[str, Any], headers: _Headers, path_session: str | None
) -> tuple[str | None, str | None]:
    """The session and group ids, by the precedence of docs/wire.md; validated."""
    session_forms: list[tuple[str, Any]] = [
        ("vllm_xargs.session_id", xargs.get(XARG_SESSION)),
        ("session_id", data.get("session_id")),
        ("header X-Session-Id", headers.get("x-session-id")),
        ("URL /sessions/<id>/", path_session),
        ("header x-litellm-session-id", headers.get("x-litellm-session-id")),
        ("prompt_cache_key", data.get("prompt_cache_key")),
        ("header X-SMG-Routing-Key", headers.get("x-smg-routing-key")),
    ]
    group_forms: list[tuple[str, Any]] = [
        ("vllm_xargs.group_id", xargs.get(XARG_GROUP)),
        ("header X-Group-Id", headers.get("x-group-id")),
    ]
    return _first_id(session_forms), _first_id(group_forms)


def _first_id(forms: list[tuple[str, Any]]) -> str | None:
    for field_name, value in forms:
        if value is None:
            continue
        if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
            raise _bad_id(field_name)
        return value
    return None


def _bad_id(field_name: str) -> WireError:
    return WireError(f"{field_name} must be 1 to 128 characters of letters, digits and . _ : @ / -", field_name)


def _over_tokens(limit: int, where: str) -> WireError:
    return WireError(
        f"agentspec_seeds exceed the limit max_seed_tokens_per_request={limit} tokens (at {where})",
        "agentspec_seeds",
    )


def _app_state(scope: Scope) -> Any:
    app = scope.get("app")
    state = getattr(app, "state", None)
    if state is None or getattr(state, "engine_client", None) is None:
        raise WireError("this server cannot take seeds (no engine client)", "agentspec_seeds")
    return state


async def _tokenize(state: Any, text: str) -> list[int]:
    tokenizer = state.engine_client.get_tokenizer()
    return list(tokenizer.encode(text, add_special_tokens=False))


def _vocab_size(state: Any) -> int:
    return int(state.engine_client.model_config.get_vocab_size())


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away before sending it all
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then the client's own messages (disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _with_content_length(headers: Any, length: int) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    out.append((b"content-length", str(length).encode()))
    return out


def _error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    # vLLM's (and OpenAI's) error shape, so clients surface the message.
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


async def _send_error(send: Send, exc: WireError) -> None:
    await _send_json(send, 400, _error_body(str(exc), "BadRequestError", 400, exc.param))


async def _send_json(send: Send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
