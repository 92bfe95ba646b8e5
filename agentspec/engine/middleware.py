"""Moved to :mod:`agentspec.engine.api_server.middleware`; this name keeps working for one
release (``--middleware agentspec.engine.middleware.SessionIdMiddleware`` in commands
written against it)."""

from __future__ import annotations

import warnings

from agentspec.engine.api_server.middleware import SessionIdMiddleware

__all__ = ["SessionIdMiddleware"]

warnings.warn(
    "agentspec.engine.middleware moved to agentspec.engine.api_server.middleware",
    DeprecationWarning,
    stacklevel=2,
)
