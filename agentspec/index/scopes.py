"""The scope table: the sessions and groups the index holds, their budgets and eviction.

A *scope* is a session or a group. Each has two suffix trees: its call text (for a session
its streams, i.e. the prompts and outputs of its calls, see :mod:`agentspec.index.streams`;
for a group the outputs of its calls) and its seed text. Sessions and groups share one
least-recently-used order and the budgets ``sessions_max_tokens`` and ``max_sessions``;
``session_max_tokens`` bounds each one. A scope with an active call is never evicted.

A session idle for ``session_idle_calls`` calls (calls started anywhere in the index since
its last call finished) gives up its call text, which is by far most of what it holds: its
prompts, largely the same text again each turn. Its seeds and counters stay. A session that
comes back after that is indexed again from its next prompt, which for an agent carries
its whole context, so it loses only what that prompt no longer holds. Without this, the
index keeps every finished trajectory's context until the budgets push it out (several GB
with the default budgets), while vLLM's suffix method drops a prompt when its request ends.
Likewise a group idle for ``group_idle_calls`` calls gives up its call text (its calls'
outputs), but only where those outputs went into the global corpus as well
(``isolate_groups`` off, ``global_max_tokens`` above 0): then a finished group's samples are
held once, not twice, and a group that comes back drafts them from the global level (as
long as its budget, oldest dropped first, still holds them).

A call without a session gets a scope of its own (kind ``call``) that lives exactly as long
as the call. Such scopes stay out of the LRU: they never count as sessions nor push real
ones out.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

import numpy as np

from agentspec.index.corpus import Corpus
from agentspec.index.policy import IndexConfig
from agentspec.index.streams import Stream, attach_stream
from agentspec.index.types import CallStart, ScopeStats

__all__ = ["Scope", "ScopeKey", "ScopeKind", "ScopeTable"]


class ScopeKind(StrEnum):
    SESSION = "session"
    GROUP = "group"
    CALL = "call"  # the scope of one session-less call


class ScopeKey(NamedTuple):
    kind: ScopeKind
    id: str
    #: Whose text it holds: the same id in two tenants names two scopes.
    tenant: str = ""


@dataclass(slots=True, eq=False)
class Scope:
    """A session or a group: its trees, its streams and its counters."""

    key: ScopeKey
    call_text: Corpus
    seed_text: Corpus
    stats: ScopeStats
    #: A session's streams, most recently used last (a group has none).
    streams: list[Stream] = field(default_factory=list)
    #: Each active call of the scope -> the sequence of ``call_text`` it appends to.
    active_calls: dict[Hashable, int] = field(default_factory=dict)
    ephemeral: bool = False

    @property
    def tokens(self) -> int:
        return self.call_text.tokens + self.seed_text.tokens


class ScopeTable:
    """Every scope of one index, the tokens they hold together, and what was evicted.

    All text goes into a scope's trees through :meth:`add_text` or :meth:`attach_stream`,
    which keep :attr:`held_tokens`; :meth:`enforce_budgets` evicts.
    """

    def __init__(self, config: IndexConfig) -> None:
        self._config = config
        self._max_depth = config.policy.max_depth
        # Sessions and groups, least recently used first.
        self._lru: OrderedDict[ScopeKey, Scope] = OrderedDict()
        self._call_scopes: dict[ScopeKey, Scope] = {}
        self._call_scope_ids = itertools.count()
        # Calls started so far (the clock of idleness), and per kind the scopes holding call
        # text with no call in flight, by the clock reading when their last call finished.
        self._calls_started = 0
        self._idle_since: dict[ScopeKind, OrderedDict[ScopeKey, int]] = {
            ScopeKind.SESSION: OrderedDict(),
            ScopeKind.GROUP: OrderedDict(),
        }
        group_outputs_in_global = config.global_max_tokens > 0 and not config.isolate_groups
        self._idle_limits = {
            ScopeKind.SESSION: config.session_idle_calls,
            ScopeKind.GROUP: config.group_idle_calls if group_outputs_in_global else None,
        }
        #: Tokens held by the trees of every scope.
        self.held_tokens = 0
        self.evicted_sessions = 0
        self.evicted_groups = 0
        self.evicted_tokens = 0

    # ------------------------------------------------------------------ look-up

    def get(self, key: ScopeKey) -> Scope | None:
        """The session or group, if held; does not count as a use."""
        return self._lru.get(key)

    def use(self, key: ScopeKey) -> Scope:
        """The session or group, created if need be, now the most recently used."""
        scope = self._lru.get(key)
        if scope is None:
            return self._new_scope(key)
        self._lru.move_to_end(key)
        return scope

    def new_call_scope(self) -> Scope:
        """A scope for one session-less call; :meth:`drop` it when the call finishes."""
        return self._new_scope(ScopeKey(ScopeKind.CALL, str(next(self._call_scope_ids))), ephemeral=True)

    def drop(self, scope: Scope) -> None:
        held = self._call_scopes if scope.ephemeral else self._lru
        if held.pop(scope.key, None) is not None:
            self.held_tokens -= scope.tokens
        self._idle_order(scope).pop(scope.key, None)

    # ------------------------------------------------------------------ idleness

    def call_started(self, session: Scope, group: Scope | None = None) -> None:
        """A call of ``session`` (in ``group``) starts: they are busy, and the idleness clock ticks."""
        self._calls_started += 1
        for scope in (session, group):
            if scope is not None:
                self._idle_order(scope).pop(scope.key, None)
        for kind, order in self._idle_since.items():
            self._compact_idle(order, self._idle_limits[kind])

    def call_finished(self, scope: Scope) -> None:
        """A call of ``scope`` (its session or group) finished; with none left in flight the
        scope starts being idle."""
        if not scope.active_calls and not scope.ephemeral and scope.key in self._lru:
            self._idle_order(scope)[scope.key] = self._calls_started

    def _idle_order(self, scope: Scope) -> OrderedDict[ScopeKey, int]:
        return self._idle_since.get(scope.key.kind, OrderedDict())

    def _compact_idle(self, order: OrderedDict[ScopeKey, int], limit: int | None) -> None:
        if limit is None:
            return
        while order:
            key, since = next(iter(order.items()))
            if self._calls_started - since <= limit:
                break
            del order[key]
            # Still held (an evicted one left this order) and idle (a new call removed it).
            self.evicted_tokens += self.clear_call_text(self._lru[key])

    def sessions(self) -> list[Scope]:
        return [s for s in self._lru.values() if s.key.kind is ScopeKind.SESSION]

    def groups(self) -> list[Scope]:
        return [s for s in self._lru.values() if s.key.kind is ScopeKind.GROUP]

    def call_scopes(self) -> list[Scope]:
        return list(self._call_scopes.values())

    def __iter__(self) -> Iterator[Scope]:
        """Every scope: sessions and groups (least recently used first), then call scopes."""
        yield from self._lru.values()
        yield from self._call_scopes.values()

    # ------------------------------------------------------------------ text

    def add_text(self, corpus: Corpus, seq_id: int, tokens: np.ndarray) -> int:
        """Append ``tokens`` to a sequence of one of a scope's trees; returns how many were added."""
        n = corpus.extend(seq_id, tokens)
        self.held_tokens += n
        return n

    def clear_call_text(self, scope: Scope) -> int:
        """Forget every text calls wrote into a scope (its seeds stay); returns the tokens."""
        n = scope.call_text.tokens
        scope.call_text = Corpus(self._max_depth)
        scope.streams = []
        scope.active_calls.clear()
        self.held_tokens -= n
        return n

    def attach_stream(self, session: Scope, prompt: np.ndarray) -> tuple[Stream, CallStart]:
        """The session's stream that ``prompt`` continues, with what of it was indexed
        (see :func:`agentspec.index.streams.attach_stream`)."""
        stream, start = attach_stream(session.streams, session.call_text, prompt, self._max_depth)
        self.held_tokens += start.new_tokens
        return stream, start

    # ------------------------------------------------------------------ budgets

    def enforce_budgets(self, *touched: Scope | None) -> None:
        """Bring every scope budget back within its limit; ``touched`` are the scopes that grew."""
        cfg = self._config
        for scope in touched:
            while scope is not None and scope.tokens > cfg.session_max_tokens:
                if not self._drop_oldest_text(scope):
                    break
        while self.held_tokens > cfg.sessions_max_tokens or len(self._lru) > cfg.max_sessions:
            victim = next((s for s in self._lru.values() if not s.active_calls), None)
            if victim is None:
                break  # everything is in use: over budget until calls finish
            self.drop(victim)
            if victim.key.kind is ScopeKind.SESSION:
                self.evicted_sessions += 1
            elif victim.key.kind is ScopeKind.GROUP:
                self.evicted_groups += 1
            self.evicted_tokens += victim.tokens

    def _new_scope(self, key: ScopeKey, ephemeral: bool = False) -> Scope:
        scope = Scope(
            key=key,
            call_text=Corpus(self._max_depth),
            seed_text=Corpus(self._max_depth),
            stats=ScopeStats(scope_id=key.id),
            ephemeral=ephemeral,
        )
        (self._call_scopes if ephemeral else self._lru)[key] = scope
        return scope

    def _drop_oldest_text(self, scope: Scope) -> bool:
        """Drop the scope's oldest sequence that no active call appends to; False if none."""
        # Seeds go first: a session's own streams are what its next turn most likely repeats.
        for corpus, keep in ((scope.seed_text, ()), (scope.call_text, set(scope.active_calls.values()))):
            freed = corpus.drop_oldest(keep=keep)
            if freed:
                self.held_tokens -= freed
                self.evicted_tokens += freed
                scope.streams = [s for s in scope.streams if s.seq_id in scope.call_text]
                return True
        return False
