"""Moved to :mod:`agentspec.engine.launcher.serve`; this name keeps working for one release
(e.g. ``from agentspec.engine.serve import default_speculative_config``)."""

from __future__ import annotations

import warnings

from agentspec.engine.launcher.serve import (
    build_command,
    build_env,
    default_speculative_config,
    hybrid_speculative_config,
    serve,
)

__all__ = ["build_command", "build_env", "default_speculative_config", "hybrid_speculative_config", "serve"]

warnings.warn("agentspec.engine.serve moved to agentspec.engine.launcher.serve", DeprecationWarning, stacklevel=2)
