"""agentspec's own routes on vLLM's server, ``/agentspec/v1/*``: statistics, seeds and
policy versions.

A table of routes (:data:`ROUTES`), each a method, a path pattern and a handler. Seeds and
policy versions must reach the engine, and per-request data reaches it only on a request:
they travel on a one-token completion through the wrapped app (vLLM), marked so that the
proposer applies them and neither indexes nor drafts it. A route that is not here falls
through to vLLM (its 404 or 405).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from agentspec import wire
from agentspec.engine.api_server.asgi import (
    ASGIApp,
    Headers,
    Receive,
    Scope,
    Send,
    call,
    read_body,
    replay,
    send_error,
    send_json,
    with_content_length,
)
from agentspec.engine.api_server.seeds import SeedReader
from agentspec.engine.settings import EngineSettings
from agentspec.engine.snapshots import SnapshotReader
from agentspec.engine.tenancy import request_tenant
from agentspec.wire import WireError


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as the middleware established it before routing."""

    api_key: str | None  # the key vLLM accepted; None when the server has none
    path_session: str | None  # the id of a /sessions/<id>/ URL prefix


Handler = Callable[["ControlPlane", Scope, Receive, Send, Caller, "re.Match[str]"], Awaitable[None]]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler


class ControlPlane:
    """The handlers of :data:`ROUTES`; ``app`` is vLLM's, which carries control requests."""

    def __init__(
        self, app: ASGIApp, settings: EngineSettings, reader: SnapshotReader | None, seeds: SeedReader
    ) -> None:
        self.app = app
        self.settings = settings
        self.reader = reader
        self.seeds = seeds
        # RL policy versions: the newest this process passed on, and when it started (the
        # engine's statistics written before then are an earlier run's).
        self._policy_version: int | None = None
        self._started = time.time()

    async def handle(self, scope: Scope, receive: Receive, send: Send, path: str, caller: Caller) -> bool:
        """Answer the request if a route matches it; False when none does."""
        method = scope.get("method", "GET")
        for route in ROUTES:
            if route.method == method and (match := route.pattern.match(path)):
                await route.handler(self, scope, receive, send, caller, match)
                return True
        return False

    def tenant(self, api_key: str | None, cache_salt: object) -> str:
        return request_tenant(self.settings.share_across_tenants, api_key, cache_salt)

    # ------------------------------------------------------------------ statistics

    async def session_stats(
        self, scope: Scope, receive: Receive, send: Send, caller: Caller, match: re.Match[str]
    ) -> None:
        """``GET /agentspec/v1/sessions/{id}``: one of the caller's tenant's sessions; another
        tenant's is not found."""
        session_id = match.group("session_id")
        salt = parse_qs(scope.get("query_string", b"").decode("latin-1")).get(wire.CACHE_SALT_FIELD, [None])[0]
        tenant = self.tenant(caller.api_key, salt)
        if not wire.is_valid_id(session_id):
            await send_error(send, wire.bad_id("path session id"))
            return
        view = self.reader.session(session_id, tenant) if self.reader is not None else None
        if view is None:
            await send_json(send, 404, wire.error_body(f"no state for session {session_id!r}", "NotFoundError", 404))
            return
        await send_json(send, 200, view)

    async def summary(self, scope: Scope, receive: Receive, send: Send, caller: Caller, match: re.Match[str]) -> None:
        """``GET /agentspec/v1/stats``: the server's counters."""
        if self.reader is None:
            await send_json(
                send, 404, wire.error_body("statistics are not published (no state_dir)", "NotFoundError", 404)
            )
            return
        await send_json(send, 200, self.reader.summary())

    # ------------------------------------------------------------------ seeds

    async def seed_only(self, scope: Scope, receive: Receive, send: Send, caller: Caller, match: re.Match[str]) -> None:
        """``POST /agentspec/v1/seeds``: put seeds into a session's or group's index now.

        The seeds travel on a one-token completion marked seed-only. It passes through vLLM
        like any ``/v1`` request (the same authentication, the same queue) and costs one
        token of prefill and decode.
        """
        body = await read_body(receive)
        try:
            data = wire.check_seeds_request(json.loads(body) if body else None)
            session_id, group_id = wire.resolve_ids(data, Headers(scope).get, caller.path_session)
            seeds = await self.seeds.read(scope, data[wire.SEEDS_FIELD], session_id, group_id)
        except (ValueError, RecursionError) as exc:  # WireError, or JSON too deep or malformed
            await send_error(send, exc if isinstance(exc, WireError) else WireError("the body is not valid JSON"))
            return
        inner_xargs: dict[str, Any] = {
            wire.XARG_SEEDS: json.dumps(seeds, separators=(",", ":")),
            wire.XARG_SEED_ONLY: 1,
            wire.XARG_TENANT: self.tenant(caller.api_key, data.get(wire.CACHE_SALT_FIELD)),
        }
        if session_id is not None:
            inner_xargs[wire.XARG_SESSION] = session_id
        if group_id is not None:
            inner_xargs[wire.XARG_GROUP] = group_id
        first_token = next(t for seed in seeds for t in seed["token_ids"])
        if not await self._control(scope, receive, send, first_token, inner_xargs):
            return
        seeded = sum(len(seed["token_ids"]) for seed in seeds)
        await send_json(send, 200, wire.seeds_response_body(session_id, group_id, seeded))

    # ------------------------------------------------------------------ policy versions

    async def policy(self, scope: Scope, receive: Receive, send: Send, caller: Caller, match: re.Match[str]) -> None:
        """``POST /agentspec/v1/policy``: a new policy version is live (RL weight updates).

        The engine applies it when the carrying request arrives: requests admitted later run
        under it; those in flight finish as they started, no longer feeding group or global
        drafting; unless ``keep_old_outputs``, older outputs stop drafting at those levels.
        A version older than the live one is a 409 naming both (the caller is behind); the
        live one again is passed on, so a retried announcement is harmless.
        """
        body = await read_body(receive)
        try:
            version, keep = wire.check_policy_request(json.loads(body) if body else None)
        except (ValueError, RecursionError) as exc:  # WireError, or JSON too deep or malformed
            await send_error(send, exc if isinstance(exc, WireError) else WireError("the body is not valid JSON"))
            return
        live = self._live_policy_version()
        if live is not None and version < live:
            message = f"policy version {version} is older than the live one ({live}); versions only move forward"
            status = wire.POLICY_CONFLICT_STATUS
            await send_json(send, status, wire.error_body(message, "ConflictError", status, "version"))
            return
        # Taken before the request leaves, so that a concurrent older one is refused too.
        before, taken = self._policy_version, version if live is None else max(live, version)
        self._policy_version = taken
        xargs = {wire.XARG_POLICY_VERSION: version, wire.XARG_KEEP_OLD_OUTPUTS: int(keep), wire.XARG_SEED_ONLY: 1}
        # Token 0 exists in every vocabulary; the request is neither indexed nor drafted.
        if await self._control(scope, receive, send, 0, xargs):
            await send_json(send, 200, {"version": version, "keep_old_outputs": keep})
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

    # ------------------------------------------------------------------ carrying to the engine

    async def _control(self, scope: Scope, receive: Receive, send: Send, token: int, xargs: dict[str, Any]) -> bool:
        """Carry ``xargs`` to the engine on a one-token completion. False when vLLM refused
        it; its answer was sent."""
        if self.settings.admission_token is not None:
            xargs = {**xargs, wire.XARG_ADMISSION: self.settings.admission_token}
        inner = json.dumps({"prompt": [token], "max_tokens": 1, "temperature": 0, "vllm_xargs": xargs}).encode()
        path = "/v1/completions"
        inner_scope = dict(
            scope, path=path, raw_path=path.encode(), headers=with_content_length(scope["headers"], len(inner))
        )
        status, response_headers, response = await call(self.app, inner_scope, replay(inner, receive))
        if status != 200:
            # vLLM's own refusal (401 without the key, 400, 5xx): pass it on unchanged.
            await send({"type": "http.response.start", "status": status, "headers": response_headers})
            await send({"type": "http.response.body", "body": response, "more_body": False})
            return False
        return True


def _exact(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(path) + "$")


#: agentspec's routes, matched in order.
ROUTES: tuple[Route, ...] = (
    Route(
        "GET", re.compile("^" + re.escape(wire.SESSION_STATS_PATH) + "(?P<session_id>.+)$"), ControlPlane.session_stats
    ),
    Route("GET", _exact(wire.SERVER_STATS_PATH), ControlPlane.summary),
    Route("POST", _exact(wire.SEEDS_PATH), ControlPlane.seed_only),
    Route("POST", _exact(wire.POLICY_PATH), ControlPlane.policy),
)
