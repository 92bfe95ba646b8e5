"""Moved to :mod:`agentspec.index.policy`; this name keeps working for one release.

``DraftPolicy`` and ``IndexConfig`` are also importable from :mod:`agentspec` itself.
"""

from __future__ import annotations

import warnings

from agentspec.index.policy import DraftPolicy, IndexConfig

__all__ = ["DraftPolicy", "IndexConfig"]

warnings.warn(
    "agentspec.policy moved to agentspec.index.policy (or import DraftPolicy and IndexConfig from agentspec)",
    DeprecationWarning,
    stacklevel=2,
)
