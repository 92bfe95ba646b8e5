"""agentspec: session-aware speculative decoding for LLM agent loops on vLLM.

The core is the draft index (:mod:`agentspec.index`), which imports no vLLM, HTTP or
framework code. The engine plugin (:mod:`agentspec.engine`), the client
(:mod:`agentspec.client`) and the replay benchmark (:mod:`agentspec.replay`) sit around it.
"""

from agentspec.errors import DraftIndexError, SeedLimitError, UnknownCallError
from agentspec.index import CallStart, Draft, DraftIndex, IndexStats, Level, SeedKind, SessionStats
from agentspec.policy import DraftPolicy, IndexConfig

__version__ = "0.1.0"

__all__ = [
    "CallStart",
    "Draft",
    "DraftIndex",
    "DraftIndexError",
    "DraftPolicy",
    "IndexConfig",
    "IndexStats",
    "Level",
    "SeedKind",
    "SeedLimitError",
    "SessionStats",
    "UnknownCallError",
    "__version__",
]
