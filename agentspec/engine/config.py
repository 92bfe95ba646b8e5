"""Moved to :mod:`agentspec.engine.settings`; this name keeps working for one release."""

from __future__ import annotations

import warnings

from agentspec.engine.settings import ENV_CONFIG, DrafterSettings, EngineSettings, enabled, load_settings

__all__ = ["ENV_CONFIG", "DrafterSettings", "EngineSettings", "enabled", "load_settings"]

warnings.warn("agentspec.engine.config moved to agentspec.engine.settings", DeprecationWarning, stacklevel=2)
