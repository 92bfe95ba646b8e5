"""agentspec: session-aware speculative decoding for LLM agent loops on vLLM.

The core is the draft index (:mod:`agentspec.index`), which imports no vLLM, HTTP or
framework code. The engine plugin (:mod:`agentspec.engine`), the client
(:mod:`agentspec.client`) and the replay benchmark (:mod:`agentspec.replay`) sit around it.

Importing :mod:`agentspec` imports nothing else: the names below load on first use
(PEP 562), so the client and the wire contract stay light in the base install. The draft
index needs the ``index`` extra (README, "Installing"); without it,
using its names raises an :class:`ImportError` that says so.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentspec.errors import DraftIndexError, SeedLimitError, UnknownCallError
    from agentspec.index import CallStart, Draft, DraftIndex, IndexStats, Level, ScopeStats
    from agentspec.index.policy import DraftPolicy, IndexConfig
    from agentspec.wire import SeedKind

    __version__: str

#: Public name -> (module, extra it needs or None).
_LAZY: dict[str, tuple[str, str | None]] = {
    "CallStart": ("agentspec.index.types", None),
    "Draft": ("agentspec.index.types", None),
    "DraftIndex": ("agentspec.index.draft_index", "index"),
    "IndexStats": ("agentspec.index.types", None),
    "Level": ("agentspec.index.types", None),
    "ScopeStats": ("agentspec.index.types", None),
    "DraftIndexError": ("agentspec.errors", None),
    "SeedLimitError": ("agentspec.errors", None),
    "UnknownCallError": ("agentspec.errors", None),
    "DraftPolicy": ("agentspec.index.policy", None),
    "IndexConfig": ("agentspec.index.policy", None),
    "SeedKind": ("agentspec.wire", None),
}

__all__ = [
    "CallStart",
    "Draft",
    "DraftIndex",
    "DraftIndexError",
    "DraftPolicy",
    "IndexConfig",
    "IndexStats",
    "Level",
    "ScopeStats",
    "SeedKind",
    "SeedLimitError",
    "UnknownCallError",
    "__version__",
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-agentspec")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        value: Any = _version()
    elif name in _LAZY:
        module_name, extra = _LAZY[name]
        if extra is None:
            module = importlib.import_module(module_name)
        else:
            from agentspec._extras import import_module

            module = import_module(module_name, extra)
        value = getattr(module, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
