"""Session ids and seeds on the wire: an ASGI middleware for vLLM's OpenAI server.

Load it with ``--middleware agentspec.engine.api_server.middleware.SessionIdMiddleware``
(``agentspec serve`` does). Each request goes through, in order:

1. the rLLM-style path prefix ``/sessions/<id>/v1/...`` rewritten to ``/v1/...`` (a pure
   rewrite, so the prefixed path is guarded exactly as the plain one);
2. vLLM's own API-key check (:mod:`~agentspec.engine.api_server.auth`): no agentspec work
   happens for a request vLLM would refuse;
3. agentspec's routes, ``/agentspec/v1/*`` (:mod:`~agentspec.engine.api_server.control_plane`):
   statistics, seeds, policy versions;
4. for generation requests, the body rewritten: every form of session id the ecosystem
   sends (docs/wire.md) mapped to ``vllm_xargs.session_id`` / ``group_id``, which vLLM
   hands the engine as ``SamplingParams.extra_args``; ``agentspec_seeds`` validated,
   tokenized and moved into ``vllm_xargs`` (as JSON; vLLM refuses nested objects there);
   the tenant and the admission token stamped;
5. ``/metrics``: agentspec's series brought up to date before vLLM answers
   (:mod:`~agentspec.engine.api_server.prometheus`).

A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``): it replays the rewritten
body once and then hands ``receive`` back to the app, so vLLM still sees the client
disconnect and aborts the request.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agentspec import wire
from agentspec.engine.api_server.asgi import (
    ASGIApp,
    Headers,
    Receive,
    Scope,
    Send,
    read_body,
    replay,
    send_error,
    send_json,
    with_content_length,
)
from agentspec.engine.api_server.auth import VllmAuthentication
from agentspec.engine.api_server.control_plane import Caller, ControlPlane
from agentspec.engine.api_server.prometheus import install as install_metrics
from agentspec.engine.api_server.seeds import SeedReader
from agentspec.engine.settings import EngineSettings, load_settings
from agentspec.engine.snapshots import SnapshotReader
from agentspec.engine.tenancy import request_tenant
from agentspec.wire import WireError

logger = logging.getLogger(__name__)


class SessionIdMiddleware:
    """See the module docstring. ``settings`` default to the process's environment."""

    def __init__(self, app: ASGIApp, settings: EngineSettings | None = None) -> None:
        self.app = app
        self.settings = settings or load_settings()
        self.reader = SnapshotReader(Path(self.settings.state_dir)) if self.settings.state_dir else None
        # agentspec's series, registered where vLLM's /metrics collects from; in
        # multiprocess mode a refresh to run before each scrape.
        self._refresh_metrics = install_metrics(self.reader) if self.reader is not None else None
        self.auth = VllmAuthentication(app)
        self.seeds = SeedReader(self.settings)
        self.control_plane = ControlPlane(app, self.settings, self.reader, self.seeds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        method: str = scope.get("method", "GET")

        path_session = None
        if prefixed := wire.split_session_path(path):
            path_session, path = prefixed
            scope = dict(scope, path=path, raw_path=path.encode())
        if not self.auth.admits(scope, path, method):
            # vLLM's own answer to a missing or wrong key (its AuthenticationMiddleware).
            await send_json(send, 401, {"error": "Unauthorized"})
            return
        caller = Caller(api_key=self.auth.api_key(scope), path_session=path_session)
        if path_session is not None and not wire.is_valid_id(path_session):
            await send_error(send, wire.bad_id("URL /sessions/<id>/"))
            return

        if await self.control_plane.handle(scope, receive, send, path, caller):
            return
        if method == "GET" and path.rstrip("/") == "/metrics" and self._refresh_metrics is not None:
            await self._metrics(scope, receive, send)
            return
        if method != "POST" or path not in wire.GENERATION_PATHS:
            await self.app(scope, receive, send)
            return

        body = await read_body(receive)
        try:
            new_body = await self._rewrite(scope, body, caller)
        except WireError as exc:
            await send_error(send, exc)
            return
        if new_body is not body:
            scope = dict(scope, headers=with_content_length(scope["headers"], len(new_body)))
        await self.app(scope, replay(new_body, receive), send)

    async def _rewrite(self, scope: Scope, body: bytes, caller: Caller) -> bytes:
        """The body with ids, tenant and seeds in ``vllm_xargs``; the same object when unchanged."""
        headers = Headers(scope)
        try:
            data = json.loads(body) if body else None
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than json's stack
            data = None
        if not isinstance(data, dict):
            # Not ours to judge: vLLM answers malformed JSON with its own 400. But an id
            # outside the body must still be valid.
            wire.resolve_ids({}, headers.get, caller.path_session)
            return body
        xargs = data.get("vllm_xargs")
        if xargs is None:
            xargs = {}
        if not isinstance(xargs, dict):
            return body  # vLLM refuses it with its own message
        wire.refuse_reserved_xargs(xargs)
        session_id, group_id = wire.resolve_ids(data, headers.get, caller.path_session)
        raw_seeds = data.pop(wire.SEEDS_FIELD, None)
        seeds = await self.seeds.read(scope, raw_seeds, session_id, group_id) if raw_seeds is not None else []
        tenant = request_tenant(self.settings.share_across_tenants, caller.api_key, data.get(wire.CACHE_SALT_FIELD))

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

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """vLLM's /metrics, after agentspec's multiprocess files are brought up to date."""
        import anyio.to_thread

        assert self._refresh_metrics is not None
        try:
            await anyio.to_thread.run_sync(self._refresh_metrics)
        except OSError as exc:  # the scrape still gets vLLM's series and the previous ones
            logger.warning("agentspec: cannot write metrics for this scrape: %s", exc)
        await self.app(scope, receive, send)
