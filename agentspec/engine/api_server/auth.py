"""vLLM's API-key check, applied before any agentspec work.

Middlewares given with ``--middleware`` run outside vLLM's authentication, so without this
a caller without the key would get agentspec's work (tokenized seeds, session statistics)
before vLLM refused it. The check is vLLM's own authenticator, for the paths vLLM guards
and for agentspec's; ``/metrics`` stays as vLLM leaves it (open).
"""

from __future__ import annotations

from typing import Any

from agentspec.engine.api_server.asgi import ASGIApp, Headers, Scope
from agentspec.engine.tenancy import bearer_token

#: agentspec's own routes, guarded by the server's API key like vLLM's ``/v1`` routes.
AGENTSPEC_PREFIX = "/agentspec/"
_UNSET: Any = object()


class VllmAuthentication:
    """The server's keys (``--api-key``, else ``VLLM_API_KEY``), read from the app's state
    on the first request, when vLLM has set it."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._auth: Any = _UNSET
        self._guarded: tuple[str, ...] = ()

    def admits(self, scope: Scope, path: str, method: str) -> bool:
        """Whether vLLM would let this request through (always, where it guards nothing)."""
        if method == "OPTIONS":
            return True
        auth, guarded = self._auth_for(scope)
        if auth is None or not path.startswith(guarded):
            return True
        return bool(auth.verify_token(_starlette_headers(scope)))

    def api_key(self, scope: Scope) -> str | None:
        """The key vLLM accepted (None when the server has none): it names the tenant."""
        if self._auth_for(scope)[0] is None:
            return None
        return bearer_token(Headers(scope).first("authorization"))

    def _auth_for(self, scope: Scope) -> tuple[Any, tuple[str, ...]]:
        """vLLM's authenticator for the server's keys (None when it has none) and the path
        prefixes it guards, agentspec's added."""
        if self._auth is _UNSET:
            from agentspec.engine.vllm.surface import load

            authentication_middleware = load("AuthenticationMiddleware")
            args = getattr(getattr(scope.get("app"), "state", None), "args", None)
            # The same rule as vLLM's init_entrypoints_middleware: --api-key wins over the variable.
            tokens = [key for key in (getattr(args, "api_key", None) or [load("api_key_env")]) if key]
            self._auth = authentication_middleware(self._app, tokens) if tokens else None
            self._guarded = (*load("GUARDED_PREFIX"), AGENTSPEC_PREFIX)
        return self._auth, self._guarded


def _starlette_headers(scope: Scope) -> Any:
    from starlette.datastructures import Headers as StarletteHeaders

    return StarletteHeaders(scope=scope)
