"""Session ids and seeds on the wire: an ASGI middleware for vLLM's OpenAI server.

Load it with ``--middleware agentspec.engine.middleware.SessionIdMiddleware`` (``agentspec
serve`` does). For generation requests it maps every form of session id the ecosystem
sends (docs/wire.md) to one internal form, ``vllm_xargs.session_id`` / ``group_id``, which
vLLM hands the engine as ``SamplingParams.extra_args``; validates and tokenizes
``agentspec_seeds`` and moves them into ``vllm_xargs`` (as JSON; vLLM refuses nested
objects there); and rewrites the rLLM-style path prefix ``/sessions/<id>/v1/...`` to
``/v1/...``. It also serves the proposer's statistics: ``GET /agentspec/v1/sessions/{id}``,
``GET /agentspec/v1/stats``, and the ``agentspec_*`` series on vLLM's ``/metrics``
(:mod:`agentspec.engine.prometheus`).

A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``): it replays the rewritten
body once and then hands ``receive`` back to the app, so vLLM still sees the client
disconnect and aborts the request.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from agentspec import wire
from agentspec.engine.config import EngineSettings, load_settings
from agentspec.engine.metrics import SnapshotReader
from agentspec.engine.prometheus import install as install_metrics
from agentspec.engine.tenancy import SHARED_TENANT, bearer_token, tenant_for
from agentspec.wire import WireError

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_STATS_PATH = re.compile("^" + re.escape(wire.SESSION_STATS_PATH) + "(.+)$")
# Guarded by the server's API key like vLLM's own /v1 routes.
_AGENTSPEC_PREFIX = "/agentspec/"
_UNSET: Any = object()


class SessionIdMiddleware:
    """See the module docstring. ``settings`` default to the process's environment."""

    def __init__(self, app: ASGIApp, settings: EngineSettings | None = None) -> None:
        self.app = app
        self.settings = settings or load_settings()
        self.reader = SnapshotReader(Path(self.settings.state_dir)) if self.settings.state_dir else None
        # agentspec's series, registered where vLLM's /metrics collects from; in
        # multiprocess mode a refresh to run before each scrape.
        self._refresh_metrics = install_metrics(self.reader) if self.reader is not None else None
        self._auth: Any = _UNSET
        self._tokenizers: Any = None  # an anyio CapacityLimiter, made inside the event loop
        # RL policy versions: the newest this process passed on, and when it started (the
        # engine's statistics written before then are an earlier run's).
        self._policy_version: int | None = None
        self._started = time.time()
        self._guarded: tuple[str, ...] = ()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        method: str = scope.get("method", "GET")

        # Only the pure path rewrite happens before authentication, so that
        # /sessions/<id>/v1/... is guarded exactly as /v1/... is.
        path_session = None
        if prefixed := wire.split_session_path(path):
            path_session, path = prefixed
            scope = dict(scope, path=path, raw_path=path.encode())
        if not self._authenticated(scope, path, method):
            # vLLM's own answer to a missing or wrong key (its AuthenticationMiddleware).
            await _send_json(send, 401, {"error": "Unauthorized"})
            return
        # The key vLLM accepted (None when the server has none): it names the tenant.
        api_key = bearer_token(_Headers(scope).first("authorization")) if self._auth_for(scope)[0] else None
        if path_session is not None and not wire.is_valid_id(path_session):
            await _send_error(send, wire.bad_id("URL /sessions/<id>/"))
            return

        if method == "GET" and (stats := _STATS_PATH.match(path)):
            salt = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(wire.CACHE_SALT_FIELD, [None])[0]
            await self._session_stats(stats.group(1), self._tenant(api_key, salt), send)
            return
        if method == "GET" and path == wire.SERVER_STATS_PATH:
            await self._summary(send)
            return
        if method == "GET" and path.rstrip("/") == "/metrics" and self._refresh_metrics is not None:
            await self._metrics(scope, receive, send)
            return

        headers = _Headers(scope)
        if method == "POST" and path == wire.SEEDS_PATH:
            await self._seed_only(scope, receive, send, headers, path_session, api_key)
            return
        if method == "POST" and path == wire.POLICY_PATH:
            await self._policy(scope, receive, send)
            return
        if method != "POST" or path not in wire.GENERATION_PATHS:
            await self.app(scope, receive, send)
            return

        body = await _read_body(receive)
        try:
            new_body = await self._rewrite(scope, body, headers, path_session, api_key)
        except WireError as exc:
            await _send_error(send, exc)
            return
        if new_body is not body:
            scope = dict(scope, headers=_with_content_length(scope["headers"], len(new_body)))
        await self.app(scope, _replay(new_body, receive), send)

    # ------------------------------------------------------------------ authentication

    def _authenticated(self, scope: Scope, path: str, method: str) -> bool:
        """vLLM's API-key check, for the paths vLLM guards and for agentspec's own.

        Middlewares given with ``--middleware`` run outside vLLM's authentication, so without
        this a caller without the key would get agentspec's work (tokenized seeds, session
        statistics) before vLLM refused it. ``/metrics`` stays as vLLM leaves it (open).
        """
        if method == "OPTIONS":
            return True
        auth, guarded = self._auth_for(scope)
        if auth is None or not path.startswith(guarded):
            return True
        return bool(auth.verify_token(_starlette_headers(scope)))

    def _auth_for(self, scope: Scope) -> tuple[Any, tuple[str, ...]]:
        """vLLM's authenticator for the server's keys (``--api-key``, else ``VLLM_API_KEY``;
        None when the server has none) and the path prefixes it guards, agentspec's added."""
        if self._auth is _UNSET:
            from agentspec.engine.vllm.surface import load

            authentication_middleware = load("AuthenticationMiddleware")

            args = getattr(getattr(scope.get("app"), "state", None), "args", None)
            # The same rule as vLLM's init_entrypoints_middleware: --api-key wins over the variable.
            tokens = [key for key in (getattr(args, "api_key", None) or [load("api_key_env")]) if key]
            self._auth = authentication_middleware(self.app, tokens) if tokens else None
            self._guarded = (*load("GUARDED_PREFIX"), _AGENTSPEC_PREFIX)
        return self._auth, self._guarded

    def _tenant(self, api_key: str | None, cache_salt: object) -> str:
        """The request's tenant (agentspec.engine.tenancy); the one shared tenant when the
        operator shares drafting across tenants."""
        if self.settings.share_across_tenants:
            return SHARED_TENANT
        return tenant_for(api_key, cache_salt if isinstance(cache_salt, str) else None)

    # ------------------------------------------------------------------ generation requests

    async def _rewrite(
        self, scope: Scope, body: bytes, headers: _Headers, path_session: str | None, api_key: str | None
    ) -> bytes:
        """The body with ids, tenant and seeds in ``vllm_xargs``; the same object when unchanged."""
        try:
            data = json.loads(body) if body else None
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than json's stack
            data = None
        if not isinstance(data, dict):
            # Not ours to judge: vLLM answers malformed JSON with its own 400. But an id
            # outside the body must still be valid.
            wire.resolve_ids({}, headers.get, path_session)
            return body
        xargs = data.get("vllm_xargs")
        if xargs is None:
            xargs = {}
        if not isinstance(xargs, dict):
            return body  # vLLM refuses it with its own message
        if wire.XARG_SEEDS in xargs:
            raise WireError(
                f"vllm_xargs.{wire.XARG_SEEDS} is reserved; send seeds in the top-level field {wire.SEEDS_FIELD}",
                f"vllm_xargs.{wire.XARG_SEEDS}",
            )
        if wire.XARG_SEED_ONLY in xargs:
            raise WireError(
                f"vllm_xargs.{wire.XARG_SEED_ONLY} is reserved; send seeds alone to POST {wire.SEEDS_PATH}",
                f"vllm_xargs.{wire.XARG_SEED_ONLY}",
            )
        for key in (wire.XARG_POLICY_VERSION, wire.XARG_KEEP_OLD_OUTPUTS):
            if key in xargs:
                raise WireError(f"vllm_xargs.{key} is reserved; announce a policy with POST {wire.POLICY_PATH}", f"vllm_xargs.{key}")
        if wire.XARG_TENANT in xargs:
            raise WireError(
                f"vllm_xargs.{wire.XARG_TENANT} is reserved: the server derives the tenant from the API key"
                f" and {wire.CACHE_SALT_FIELD}",
                f"vllm_xargs.{wire.XARG_TENANT}",
            )
        if wire.XARG_ADMISSION in xargs:
            raise WireError(f"vllm_xargs.{wire.XARG_ADMISSION} is reserved for the server", f"vllm_xargs.{wire.XARG_ADMISSION}")
        session_id, group_id = wire.resolve_ids(data, headers.get, path_session)
        raw_seeds = data.pop(wire.SEEDS_FIELD, None)
        seeds = await self._seeds(scope, raw_seeds, session_id, group_id) if raw_seeds is not None else []
        salt = data.get(wire.CACHE_SALT_FIELD)
        tenant = self._tenant(api_key, salt)

        token = self.settings.admission_token
        if session_id is None and group_id is None and raw_seeds is None and not tenant and token is None:
            return body
        if token is not None:
            xargs[wire.XARG_ADMISSION] = token
        if tenant:
            xargs[wire.XARG_TENANT] = tenant
        if session_id is not None:
            xargs[wire.XARG_SESSION] = session_id
        if group_id is not None:
            xargs[wire.XARG_GROUP] = group_id
        if seeds:
            xargs[wire.XARG_SEEDS] = json.dumps(seeds, separators=(",", ":"))
        data["vllm_xargs"] = xargs
        return json.dumps(data).encode()

    async def _control(
        self, scope: Scope, receive: Receive, send: Send, token: int, xargs: dict[str, Any]
    ) -> bool:
        """Carry ``xargs`` to the engine on a one-token completion (per-request data reaches
        the engine only on a request). False when vLLM refused it; its answer was sent."""
        if self.settings.admission_token is not None:
            xargs = {**xargs, wire.XARG_ADMISSION: self.settings.admission_token}
        inner = json.dumps({"prompt": [token], "max_tokens": 1, "temperature": 0, "vllm_xargs": xargs}).encode()
        path = "/v1/completions"
        inner_scope = dict(
            scope, path=path, raw_path=path.encode(), headers=_with_content_length(scope["headers"], len(inner))
        )
        status, response_headers, response = await _call(self.app, inner_scope, _replay(inner, receive))
        if status != 200:
            # vLLM's own refusal (401 without the key, 400, 5xx): pass it on unchanged.
            await send({"type": "http.response.start", "status": status, "headers": response_headers})
            await send({"type": "http.response.body", "body": response, "more_body": False})
            return False
        return True

    async def _policy(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /agentspec/v1/policy``: a new policy version is live (RL weight updates).

        The engine applies it when the carrying request arrives: requests admitted later run
        under it; those in flight finish as they started, no longer feeding group or global
        drafting; unless ``keep_old_outputs``, older outputs stop drafting at those levels.
        A version older than the live one is a 409 naming both (the caller is behind); the
        live one again is passed on, so a retried announcement is harmless.
        """
        body = await _read_body(receive)
        try:
            version, keep = wire.check_policy_request(json.loads(body) if body else None)
        except (ValueError, RecursionError) as exc:  # WireError, or JSON too deep or malformed
            await _send_error(send, exc if isinstance(exc, WireError) else WireError("the body is not valid JSON"))
            return
        live = self._live_policy_version()
        if live is not None and version < live:
            message = f"policy version {version} is older than the live one ({live}); versions only move forward"
            status = wire.POLICY_CONFLICT_STATUS
            await _send_json(send, status, wire.error_body(message, "ConflictError", status, "version"))
            return
        # Taken before the request leaves, so that a concurrent older one is refused too.
        before, taken = self._policy_version, version if live is None else max(live, version)
        self._policy_version = taken
        xargs = {wire.XARG_POLICY_VERSION: version, wire.XARG_KEEP_OLD_OUTPUTS: int(keep), wire.XARG_SEED_ONLY: 1}
        # Token 0 exists in every vocabulary; the request is neither indexed nor drafted.
        if await self._control(scope, receive, send, 0, xargs):
            await _send_json(send, 200, {"version": version, "keep_old_outputs": keep})
        elif self._policy_version == taken:
            self._policy_version = before  # the engine did not take it (nor anything newer since)

    def _live_policy_version(self) -> int | None:
        """The newest policy version this server has taken: what this process passed on, or
        what the engine published since this process started (another API server process
        may have passed it on)."""
        versions = [] if self._policy_version is None else [self._policy_version]
        for snap in self.reader.snapshots() if self.reader is not None else ():
            published = snap.get("engine", {}).get("policy_version")
            if isinstance(published, int) and snap.get("written_at", 0.0) >= self._started:
                versions.append(published)
        return max(versions, default=None)

    async def _seed_only(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: _Headers,
        path_session: str | None,
        api_key: str | None,
    ) -> None:
        """``POST /agentspec/v1/seeds``: put seeds into a session's or group's index now.

        Per-request data reaches the engine only on a request, so the seeds travel on a
        one-token completion marked seed-only: the proposer applies its seeds and neither
        indexes nor drafts it. It passes through vLLM like any ``/v1`` request (the same
        authentication, the same queue) and costs one token of prefill and decode.
        """
        body = await _read_body(receive)
        try:
            data = wire.check_seeds_request(json.loads(body) if body else None)
            session_id, group_id = wire.resolve_ids(data, headers.get, path_session)
            seeds = await self._seeds(scope, data[wire.SEEDS_FIELD], session_id, group_id)
        except (ValueError, RecursionError) as exc:  # WireError, or JSON too deep or malformed
            await _send_error(send, exc if isinstance(exc, WireError) else WireError("the body is not valid JSON"))
            return
        salt = data.get(wire.CACHE_SALT_FIELD)
        inner_xargs: dict[str, Any] = {
            wire.XARG_SEEDS: json.dumps(seeds, separators=(",", ":")),
            wire.XARG_SEED_ONLY: 1,
            wire.XARG_TENANT: self._tenant(api_key, salt),
        }
        if session_id is not None:
            inner_xargs[wire.XARG_SESSION] = session_id
        if group_id is not None:
            inner_xargs[wire.XARG_GROUP] = group_id
        first_token = next(t for seed in seeds for t in seed["token_ids"])
        if not await self._control(scope, receive, send, first_token, inner_xargs):
            return
        seeded = sum(len(seed["token_ids"]) for seed in seeds)
        await _send_json(send, 200, wire.seeds_response_body(session_id, group_id, seeded))

    async def _seeds(
        self, scope: Scope, raw: Any, session_id: str | None, group_id: str | None
    ) -> list[dict[str, Any]]:
        """Validate ``agentspec_seeds``; return them as token ids (the internal form)."""
        limit_tokens = self.settings.max_seed_tokens_per_request
        specs = wire.parse_seeds(
            raw,
            session_id=session_id,
            group_id=group_id,
            max_seeds=self.settings.max_seeds_per_request,
            max_tokens=limit_tokens,
        )
        state = _app_state(scope) if specs else None
        out: list[dict[str, Any]] = []
        total = 0
        for spec in specs:
            if spec.text is not None:
                token_ids = await self._tokenize(state, spec.text, limit_tokens - total)
            else:
                token_ids = list(spec.token_ids or ())
                wire.check_vocabulary(spec, token_ids, _vocab_size(state))
            total += len(token_ids)
            if total > limit_tokens:
                raise wire.seed_tokens_over_limit(limit_tokens, spec.where)
            out.append({"token_ids": token_ids, "scope": spec.scope.value, "kind": spec.kind.value})
        return out

    async def _tokenize(self, state: Any, text: str, budget: int) -> list[int]:
        """``text``'s tokens, computed off the event loop a chunk at a time and abandoned
        once over ``budget``: a flood of maximal seeds costs each at most its budget's worth
        of tokenizing, and never stalls other requests or ``/health``."""
        import anyio
        import anyio.to_thread

        if self._tokenizers is None:
            self._tokenizers = anyio.CapacityLimiter(_TOKENIZE_THREADS)
        tokenizer = state.engine_client.get_tokenizer()

        def encode(chunk: str) -> list[int]:
            return list(tokenizer.encode(chunk, add_special_tokens=False))

        out: list[int] = []
        for chunk in _chunks(text, _TOKENIZE_CHUNK_CHARS):
            out += await anyio.to_thread.run_sync(encode, chunk, limiter=self._tokenizers)
            if len(out) > budget:
                break  # the caller refuses it; the rest is not worth tokenizing
        return out

    # ------------------------------------------------------------------ statistics

    async def _session_stats(self, session_id: str, tenant: str, send: Send) -> None:
        """One of the caller's tenant's sessions: another tenant's is not found."""
        if not wire.is_valid_id(session_id):
            await _send_error(send, wire.bad_id("path session id"))
            return
        view = self.reader.session(session_id, tenant) if self.reader is not None else None
        if view is None:
            await _send_json(send, 404, wire.error_body(f"no state for session {session_id!r}", "NotFoundError", 404))
            return
        await _send_json(send, 200, view)

    async def _summary(self, send: Send) -> None:
        if self.reader is None:
            await _send_json(
                send, 404, wire.error_body("statistics are not published (no state_dir)", "NotFoundError", 404)
            )
            return
        await _send_json(send, 200, self.reader.summary())

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /metrics, after agentspec's multiprocess files are brought up to date."""
        import anyio.to_thread

        assert self._refresh_metrics is not None
        try:
            await anyio.to_thread.run_sync(self._refresh_metrics)
        except OSError as exc:  # the scrape still gets vLLM's series and the previous ones
            logger.warning("agentspec: cannot write metrics for this scrape: %s", exc)
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------- helpers


class _Headers:
    """A request's headers by lower-cased name, all values kept."""

    def __init__(self, scope: Scope) -> None:
        self._h: dict[str, list[str]] = {}
        for key, value in scope.get("headers", []):
            self._h.setdefault(key.decode("latin-1").lower(), []).append(value.decode("latin-1"))

    def first(self, name: str) -> str | None:
        values = self._h.get(name.lower())
        return values[0] if values else None

    def get(self, name: str) -> str | None:
        """The header's value; a header sent several times with different values is refused
        (which one a router in front hashed is unknowable)."""
        values = self._h.get(name.lower())
        if not values:
            return None
        if len(set(values)) > 1:
            raise WireError(f"header {name} appears {len(values)} times with different values", f"header {name}")
        return values[0]


def _app_state(scope: Scope) -> Any:
    app = scope.get("app")
    state = getattr(app, "state", None)
    if state is None or getattr(state, "engine_client", None) is None:
        raise WireError("this server cannot take seeds (no engine client)", wire.SEEDS_FIELD)
    return state


def _starlette_headers(scope: Scope) -> Any:
    from starlette.datastructures import Headers

    return Headers(scope=scope)


#: Text seeds are tokenized this many characters at a time (cut after a newline or space
#: where there is one, so chunk seams rarely split what would be one token).
_TOKENIZE_CHUNK_CHARS = 16_384
#: Seed tokenizations at once; the others wait (threads, not the event loop).
_TOKENIZE_THREADS = 2


def _chunks(text: str, size: int) -> list[str]:
    out: list[str] = []
    start = 0
    while len(text) - start > size:
        end = start + size
        cut = max(text.rfind("\n", start + size // 2, end), text.rfind(" ", start + size // 2, end))
        end = cut + 1 if cut > 0 else end
        out.append(text[start:end])
        start = end
    out.append(text[start:])
    return out


def _vocab_size(state: Any) -> int:
    return int(state.engine_client.model_config.get_vocab_size())


async def _call(app: ASGIApp, scope: Scope, receive: Receive) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Run ``app`` on one request and collect its whole response."""
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def capture(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, capture)
    return status, headers, b"".join(chunks)


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


async def _send_error(send: Send, exc: WireError) -> None:
    await _send_json(send, 400, wire.error_body(str(exc), "BadRequestError", 400, exc.param))


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
