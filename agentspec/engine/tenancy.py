"""Who a request belongs to: its tenant, from the API key that authenticated it and vLLM's
``cache_salt``.

A tenant is what drafting is isolated by (docs/security.md): the session and group ids a
caller sends are names inside its tenant, and its text drafts for nobody else. A caller
cannot claim a tenant: the id is derived here, on the server, from the bearer token vLLM
accepted (one key, one tenant) narrowed by ``cache_salt`` (the same isolation vLLM's
prefix cache applies). Requests with neither share the default tenant ``""``. The id is a
digest, equal on every replica for the same key and salt (so the replica exchange keeps
tenants apart across a fleet), and never the key itself.
"""

from __future__ import annotations

import hashlib

__all__ = ["DEFAULT_TENANT", "SHARED_TENANT", "bearer_token", "request_tenant", "tenant_for"]

DEFAULT_TENANT = ""
#: The one tenant of a server started with ``share_across_tenants``.
SHARED_TENANT = ""


def _digest(kind: str, value: str) -> str:
    # A domain-separated digest: a key and a salt with equal text name different tenants.
    return hashlib.sha256(f"agentspec-tenant/{kind}/{value}".encode()).hexdigest()[:20]


def tenant_for(api_key: str | None, cache_salt: str | None) -> str:
    """The tenant of a request authenticated with ``api_key`` (None: the server has no key)
    that sent ``cache_salt`` (None: none)."""
    parts = []
    if api_key:
        parts.append("k-" + _digest("key", api_key))
    if cache_salt:
        parts.append("s-" + _digest("salt", cache_salt))
    return ".".join(parts)


def request_tenant(share_across_tenants: bool, api_key: str | None, cache_salt: object) -> str:
    """The tenant a request drafts in: :func:`tenant_for` its key and salt (a salt that is
    not a string counts as none), or the one shared tenant when the operator shares
    drafting across tenants."""
    if share_across_tenants:
        return SHARED_TENANT
    return tenant_for(api_key, cache_salt if isinstance(cache_salt, str) else None)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, as vLLM reads it."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token if scheme.lower() == "bearer" else None
