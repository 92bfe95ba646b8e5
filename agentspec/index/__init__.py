"""The session draft index: where agentspec's drafts come from.

Each call drafts from up to four levels and keeps the best-scoring draft:

``call``
    the call's own context (prompt and output so far). For a call in a session this is
    the session's *stream*: an agent's call N+1 sends call N's prompt and output plus new
    messages, so the stream is extended by the new tail only, and text the session sent
    before a rewrite (a condenser dropping turns) stays in it.
``session``
    what was seeded into the session: failed attempts being repaired, files about to be
    rewritten, turns replayed onto a new backend.
``group``
    outputs of the group's calls (sibling samples, trials of one task) and group seeds.
``global``
    outputs of every call, oldest dropped first (what vLLM's suffix method keeps).

The modules, one idea each:

- :mod:`~agentspec.index.types`: the value types (:class:`Draft`, :class:`Level`,
  :class:`CallStart`, :class:`ScopeStats`, :class:`IndexStats`);
- :mod:`~agentspec.index.streams`: a session's streams: which earlier context a prompt
  continues, and what of it is new (resuming after a condensed history);
- :mod:`~agentspec.index.choice`: the choice among the levels' drafts (the calibrated
  score by default; a :class:`~agentspec.index.choice.DraftChooser` can replace it);
- :mod:`~agentspec.index.scopes`: the scope table: sessions and groups, their budgets and
  least-recently-used eviction;
- :mod:`~agentspec.index.draft_index`: :class:`DraftIndex`, the facade over them (calls,
  drafting across levels, seeds, the global corpus, statistics);
- beneath them: :mod:`~agentspec.index.corpus` (one native suffix tree and its sequences),
  :mod:`~agentspec.index.tokens` (validated token arrays), :mod:`~agentspec.index.calibration`
  (how far each level's scores are borne out) and :mod:`~agentspec.index.policy` (the
  index's configuration, :class:`DraftPolicy` and :class:`IndexConfig`).

The index imports nothing of vLLM, HTTP or any framework: the engine adapter and the
replay benchmark drive the same code. It is **not thread-safe**: one thread owns it (vLLM
runs proposers on the model runner's thread).

The names below load on first use, so that the light modules (:mod:`~agentspec.index.policy`,
:mod:`~agentspec.index.types`) import without numpy or arctic-inference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentspec._extras import import_module

if TYPE_CHECKING:
    from agentspec.errors import DraftIndexError, SeedLimitError, UnknownCallError
    from agentspec.index.choice import Candidate, ChoiceContext, DraftChooser
    from agentspec.index.draft_index import DraftIndex
    from agentspec.index.policy import DraftPolicy, IndexConfig
    from agentspec.index.types import CallStart, Draft, IndexStats, Level, ScopeStats
    from agentspec.wire import SeedKind

#: Public name -> the module that defines it.
_LAZY: dict[str, str] = {
    "CallStart": "agentspec.index.types",
    "Candidate": "agentspec.index.choice",
    "ChoiceContext": "agentspec.index.choice",
    "Draft": "agentspec.index.types",
    "DraftChooser": "agentspec.index.choice",
    "DraftIndex": "agentspec.index.draft_index",
    "DraftIndexError": "agentspec.errors",
    "DraftPolicy": "agentspec.index.policy",
    "IndexConfig": "agentspec.index.policy",
    "IndexStats": "agentspec.index.types",
    "Level": "agentspec.index.types",
    "ScopeStats": "agentspec.index.types",
    "SeedKind": "agentspec.wire",
    "SeedLimitError": "agentspec.errors",
    "UnknownCallError": "agentspec.errors",
}

__all__ = [
    "CallStart",
    "Candidate",
    "ChoiceContext",
    "Draft",
    "DraftChooser",
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
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # A missing numpy or arctic-inference becomes an ImportError naming the extra.
    value = getattr(import_module(_LAZY[name], "index"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
