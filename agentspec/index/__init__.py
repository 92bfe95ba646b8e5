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
  drafting across levels, seeds, the global corpus, statistics).

The index imports nothing of vLLM, HTTP or any framework: the engine adapter and the
replay benchmark drive the same code. It is **not thread-safe**: one thread owns it (vLLM
runs proposers on the model runner's thread).
"""

from __future__ import annotations

from agentspec.errors import DraftIndexError, SeedLimitError, UnknownCallError
from agentspec.index.choice import Candidate, ChoiceContext, DraftChooser
from agentspec.index.draft_index import DraftIndex
from agentspec.index.types import CallStart, Draft, IndexStats, Level, ScopeStats
from agentspec.wire import SeedKind

__all__ = [
    "CallStart",
    "Candidate",
    "ChoiceContext",
    "Draft",
    "DraftChooser",
    "DraftIndex",
    "DraftIndexError",
    "IndexStats",
    "Level",
    "ScopeStats",
    "SeedKind",
    "SeedLimitError",
    "UnknownCallError",
]
