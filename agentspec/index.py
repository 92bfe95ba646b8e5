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

The index imports nothing of vLLM, HTTP or any framework: the engine adapter and the
replay benchmark drive the same code. It is **not thread-safe**: one thread owns it (vLLM
runs proposers on the model runner's thread).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from agentspec.calibration import LevelCalibration
from agentspec.corpus import EMPTY_TREE_DRAFT, Corpus, TreeDraft
from agentspec.errors import DraftIndexError, SeedLimitError, UnknownCallError
from agentspec.policy import IndexConfig
from agentspec.tokens import TokenBuffer, as_token_array, find_last
from agentspec.wire import SeedKind

__all__ = [
    "CallStart",
    "Draft",
    "DraftIndex",
    "DraftIndexError",
    "IndexStats",
    "Level",
    "SeedKind",
    "SeedLimitError",
    "SessionStats",
    "UnknownCallError",
]

# How many of a session's most recent streams a new prompt is compared with.
_STREAMS_COMPARED = 4


class Level(StrEnum):
    """Where a draft came from."""

    CALL = "call"
    SESSION = "session"
    GROUP = "group"
    GLOBAL = "global"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Draft:
    """A proposed continuation: ``score`` is the sum of the tokens' estimated probabilities."""

    token_ids: list[int]
    probs: list[float]
    score: float
    match_len: int
    level: Level

    @classmethod
    def empty(cls) -> Draft:
        return cls([], [], 0.0, 0, Level.NONE)


@dataclass(frozen=True, slots=True)
class CallStart:
    """What starting a call cost the index.

    ``new_tokens`` were indexed for the prompt; ``reused_tokens`` of it were already held
    by the session's stream; ``rewritten`` says the prompt did not extend any stream of the
    session (the history was rewritten, or the session is new).
    """

    new_tokens: int
    reused_tokens: int
    rewritten: bool


@dataclass(slots=True)
class SessionStats:
    """Per-session (or per-group) counters."""

    scope_id: str
    calls: int = 0
    draft_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    indexed_tokens: int = 0
    seeded_tokens: int = 0
    last_index_new_tokens: int = 0
    held_tokens: int = 0
    group_id: str | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0


@dataclass(slots=True)
class IndexStats:
    """Index-wide counters and sizes."""

    sessions: int
    groups: int
    active_calls: int
    session_tokens: int
    group_tokens: int
    global_tokens: int
    #: The trees' own memory estimate, each tree measured again after its size changed by
    #: 10% (see :meth:`agentspec.corpus.Corpus.memory_bytes`): cheap enough to poll.
    memory_bytes: int
    evicted_sessions: int
    evicted_groups: int
    evicted_tokens: int
    drafts_by_level: dict[str, int]
    drafted_tokens_by_level: dict[str, int]
    accepted_tokens_by_level: dict[str, int]


# --------------------------------------------------------------------------- internals


@dataclass(slots=True, eq=False)
class _Stream:
    """A sequence of the session's stream corpus and the full context it stands for."""

    seq_id: int
    tokens: TokenBuffer
    owner: Hashable | None = None  # the active call writing to it


@dataclass(slots=True, eq=False)
class _Scope:
    """A session or a group: its corpora, its streams and its counters."""

    key: tuple[str, str]
    stream: Corpus
    seeds: Corpus
    stats: SessionStats
    streams: list[_Stream] = field(default_factory=list)
    active_calls: set[Hashable] = field(default_factory=set)
    ephemeral: bool = False

    @property
    def tokens(self) -> int:
        return self.stream.tokens + self.seeds.tokens

    def busy_seqs(self) -> set[int]:
        return {s.seq_id for s in self.streams if s.owner is not None}


@dataclass(slots=True, eq=False)
class _Call:
    call_id: Hashable
    session: _Scope
    stream: _Stream
    group: _Scope | None
    group_seq: int | None
    global_seq: int | None
    last_level: Level = Level.NONE
    last_probs: list[float] = field(default_factory=list)
    output_start: int = 0  # where the call's output begins in its stream


class DraftIndex:
    """Session-aware suffix index: start a call, draft, extend with what was produced, finish.

    >>> index = DraftIndex()
    >>> _ = index.start_call("c1", [1, 2, 3, 4, 1, 2], session_id="s")
    >>> index.propose("c1").token_ids
    [3, 4, 1, 2]
    >>> index.finish_call("c1")
    """

    def __init__(self, config: IndexConfig | None = None) -> None:
        self.config = config or IndexConfig()
        self._depth = self.config.policy.max_depth
        self._calls: dict[Hashable, _Call] = {}
        # Sessions and groups in one LRU (least recently used first); both count
        # against ``sessions_max_tokens`` and ``max_sessions``.
        self._scopes: OrderedDict[tuple[str, str], _Scope] = OrderedDict()
        # Scopes of session-less calls live only as long as their call; they stay out
        # of the LRU so that they never count as sessions nor push real ones out.
        self._ephemeral: dict[tuple[str, str], _Scope] = {}
        self._scoped_tokens = 0
        self._global = Corpus(self._depth)
        self._global_active: set[int] = set()
        self._ephemeral_ids = itertools.count()
        self._evicted = {"session": 0, "group": 0, "tokens": 0}
        self._by_level = {lvl.value: [0, 0, 0] for lvl in Level if lvl is not Level.NONE}
        self._calibration = LevelCalibration() if self.config.policy.calibrate_levels else None

    # ------------------------------------------------------------------ calls

    def start_call(
        self,
        call_id: Hashable,
        prompt: Sequence[int] | np.ndarray,
        *,
        session_id: str | None = None,
        group_id: str | None = None,
    ) -> CallStart:
        """Begin a call; index the part of ``prompt`` the session does not hold yet."""
        self._check_hashable(call_id, "call_id")
        if call_id in self._calls:
            raise DraftIndexError(f"call {call_id!r} is already active")
        session_key = self._check_scope_id(session_id, "session_id")
        group_key = self._check_scope_id(group_id, "group_id")
        tokens = as_token_array(prompt, "prompt")

        if session_key is None:
            session = self._new_scope(("call", str(next(self._ephemeral_ids))), ephemeral=True)
        else:
            session = self._scope(("session", session_key))
        if group_key is not None and group_key == session_key:
            group_key = None  # a session that is its own group has no separate group level
        group = self._scope(("group", group_key)) if group_key is not None else None
        if group is not None:
            session.stats.group_id = group_key

        stream, new, reused, rewritten = self._attach_stream(session, tokens)
        stream.owner = call_id
        session.stats.indexed_tokens += new

        call = _Call(call_id, session, stream, group, None, None, output_start=len(stream.tokens))
        if group is not None:
            call.group_seq = group.stream.new_sequence()
            group.active_calls.add(call_id)
            group.stats.calls += 1
        if self._feeds_global(call):
            call.global_seq = self._global.new_sequence()
            self._global_active.add(call.global_seq)
        session.active_calls.add(call_id)
        session.stats.calls += 1
        session.stats.last_index_new_tokens = new
        self._calls[call_id] = call
        self._enforce_budgets(session, group)
        return CallStart(new_tokens=new, reused_tokens=reused, rewritten=rewritten)

    def extend_call(self, call_id: Hashable, tokens: Sequence[int] | np.ndarray) -> None:
        """Append tokens the call produced to its context and to the corpora it feeds."""
        call = self._call(call_id)
        arr = as_token_array(tokens, "output tokens")
        if not len(arr):
            return
        call.stream.tokens.append(arr)
        n = self._add(call.session, call.session.stream, call.stream.seq_id, arr)
        call.session.stats.indexed_tokens += n
        if call.group is not None and call.group_seq is not None:
            self._add(call.group, call.group.stream, call.group_seq, arr)
        if call.global_seq is not None:
            self._global.extend(call.global_seq, arr)
        self._enforce_budgets(call.session, call.group)

    def propose(self, call_id: Hashable, max_tokens: int | None = None) -> Draft:
        """The best draft for the call's current context, at most ``max_tokens`` long."""
        call = self._call(call_id)
        policy = self.config.policy
        budget = policy.max_spec_tokens if max_tokens is None else min(max_tokens, policy.max_spec_tokens)
        if budget <= 0:
            call.last_level = Level.NONE
            return Draft.empty()
        context = call.stream.tokens.tail(min(self._depth, policy.max_match_tokens))
        best, level = self._best_draft(call, context, budget)
        call.last_level = level
        call.last_probs = best.probs
        if level is Level.NONE:
            return Draft.empty()
        counts = self._by_level[level.value]
        counts[0] += 1
        counts[1] += len(best.token_ids)
        return Draft(best.token_ids, best.probs, best.score, best.match_len, level)

    def record_verification(self, call_id: Hashable, drafted: int, accepted: int) -> None:
        """Record how many of the last draft's tokens the target model accepted."""
        call = self._call(call_id)
        if not 0 <= accepted <= drafted:
            raise DraftIndexError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        if drafted == 0:
            return
        for scope in (call.session, call.group):
            if scope is not None:
                scope.stats.draft_steps += 1
                scope.stats.drafted_tokens += drafted
                scope.stats.accepted_tokens += accepted
        if call.last_level is not Level.NONE:
            self._by_level[call.last_level.value][2] += accepted
            if self._calibration is not None:
                self._calibration.observe(call.last_level.value, sum(call.last_probs[:drafted]), accepted)

    def finish_call(self, call_id: Hashable) -> None:
        """Release a call, finished or aborted. Its text stays in its session and corpora."""
        call = self._calls.pop(call_id, None)
        if call is None:
            raise UnknownCallError(f"call {call_id!r} is not active (never started, or already finished)")
        call.stream.owner = None
        call.session.active_calls.discard(call_id)
        if call.group is not None:
            call.group.active_calls.discard(call_id)
        if call.global_seq is not None:
            self._global_active.discard(call.global_seq)
        if call.session.ephemeral:
            self._drop_scope(call.session)
        self._enforce_budgets()

    def has_call(self, call_id: Hashable) -> bool:
        return call_id in self._calls

    # ------------------------------------------------------------------ replicas

    def shared_output(self, call_id: Hashable) -> np.ndarray | None:
        """A copy of what the call has produced so far, if it feeds the global corpus (the
        text replicas of one model may exchange); ``None`` when ``isolate_groups`` keeps it
        in its group or the global corpus is off. Ask before :meth:`finish_call`."""
        call = self._call(call_id)
        if call.global_seq is None:
            return None
        return call.stream.tokens.view(call.output_start).copy()

    def add_peer_output(self, tokens: Sequence[int] | np.ndarray) -> int:
        """Put a finished output of another replica into the global corpus (oldest text is
        dropped first beyond ``global_max_tokens``, as for local outputs). Returns the
        number of tokens added; 0 when the global corpus is off."""
        arr = as_token_array(tokens, "peer output tokens")
        if not len(arr) or self.config.global_max_tokens == 0:
            return 0
        n = self._global.extend(self._global.new_sequence(), arr)
        self._enforce_budgets()
        return n

    # ------------------------------------------------------------------ seeds

    def seed(
        self,
        tokens: Sequence[int] | np.ndarray,
        *,
        session_id: str | None = None,
        group_id: str | None = None,
        kind: SeedKind | str = SeedKind.PRIOR_TURN,
    ) -> int:
        """Put ``tokens`` into a session's or a group's index without generating them.

        Exactly one of ``session_id`` and ``group_id`` names where the seed goes. Returns the
        number of tokens seeded. Raises :class:`SeedLimitError` over the configured limits.
        """
        try:
            kind = SeedKind(kind)
        except ValueError:
            allowed = ", ".join(k.value for k in SeedKind)
            raise DraftIndexError(f"unknown seed kind {kind!r} (allowed: {allowed})") from None
        session_key = self._check_scope_id(session_id, "session_id")
        group_key = self._check_scope_id(group_id, "group_id")
        if (session_key is None) == (group_key is None):
            raise DraftIndexError("seed needs exactly one of session_id and group_id")
        arr = as_token_array(tokens, "seed tokens")
        cfg = self.config
        if len(arr) > cfg.seed_max_tokens:
            raise SeedLimitError(f"seed of {len(arr)} tokens exceeds seed_max_tokens={cfg.seed_max_tokens}")
        key = ("session", session_key) if session_key is not None else ("group", group_key)
        existing = self._scopes.get(key)
        already = existing.stats.seeded_tokens if existing is not None else 0
        if already + len(arr) > cfg.seed_max_total_tokens:
            raise SeedLimitError(
                f"seeding {len(arr)} tokens would bring {key[0]} {key[1]!r} to {already + len(arr)}"
                f" seeded tokens, over seed_max_total_tokens={cfg.seed_max_total_tokens}"
            )
        if not len(arr):
            return 0
        scope = existing if existing is not None else self._scope(key)
        self._scopes.move_to_end(key)
        seq = scope.seeds.new_sequence()
        self._add(scope, scope.seeds, seq, arr)
        scope.stats.seeded_tokens += len(arr)
        self._enforce_budgets(scope)
        return len(arr)

    # ------------------------------------------------------------------ introspection

    def session_stats(self, session_id: str) -> SessionStats | None:
        """A copy of a session's counters, or ``None`` if the index holds no such session."""
        return self._scope_stats(("session", session_id))

    def group_stats(self, group_id: str) -> SessionStats | None:
        """A copy of a group's counters, or ``None`` if the index holds no such group."""
        return self._scope_stats(("group", group_id))

    def stats(self) -> IndexStats:
        sessions = [s for s in self._scopes.values() if s.key[0] == "session"]
        groups = [s for s in self._scopes.values() if s.key[0] == "group"]
        held = [*self._scopes.values(), *self._ephemeral.values()]
        memory = self._global.memory_bytes() + sum(s.stream.memory_bytes() + s.seeds.memory_bytes() for s in held)
        return IndexStats(
            sessions=len(sessions),
            groups=len(groups),
            active_calls=len(self._calls),
            session_tokens=sum(s.tokens for s in sessions) + sum(s.tokens for s in self._ephemeral.values()),
            group_tokens=sum(s.tokens for s in groups),
            global_tokens=self._global.tokens,
            memory_bytes=memory,
            evicted_sessions=self._evicted["session"],
            evicted_groups=self._evicted["group"],
            evicted_tokens=self._evicted["tokens"],
            drafts_by_level={k: v[0] for k, v in self._by_level.items()},
            drafted_tokens_by_level={k: v[1] for k, v in self._by_level.items()},
            accepted_tokens_by_level={k: v[2] for k, v in self._by_level.items()},
        )

    def level_weights(self) -> dict[str, float]:
        """The weight each level's draft scores get when levels compete (see
        :mod:`agentspec.calibration`); empty when ``calibrate_levels`` is off or nothing
        was verified yet."""
        return self._calibration.weights() if self._calibration is not None else {}

    @property
    def held_tokens(self) -> int:
        """Tokens held by every tree of the index."""
        return self._scoped_tokens + self._global.tokens

    # ------------------------------------------------------------------ drafting

    def _best_draft(self, call: _Call, context: np.ndarray, budget: int) -> tuple[TreeDraft, Level]:
        policy = self.config.policy
        candidates: list[tuple[Corpus, Level]] = [
            (call.session.stream, Level.CALL),
            (call.session.seeds, Level.SESSION),
        ]
        if call.group is not None:
            candidates += [(call.group.stream, Level.GROUP), (call.group.seeds, Level.GROUP)]
        if self._drafts_from_global(call):
            candidates.append((self._global, Level.GLOBAL))
        calibration = self._calibration
        best: TreeDraft | None = None
        best_level = Level.NONE
        best_score = 0.0
        # Ties go to the more specific level (listed first).
        for corpus, level in candidates:
            d = corpus.speculate(context, budget, policy)
            if not d.token_ids:
                continue
            score = d.score if calibration is None else d.score * calibration.weight(level.value)
            if best is None or score > best_score:
                best, best_level, best_score = d, level, score
        return (best, best_level) if best is not None else (EMPTY_TREE_DRAFT, Level.NONE)

    def _feeds_global(self, call: _Call) -> bool:
        if self.config.global_max_tokens == 0:
            return False
        return not (self.config.isolate_groups and call.group is not None)

    def _drafts_from_global(self, call: _Call) -> bool:
        return self._feeds_global(call)

    # ------------------------------------------------------------------ streams

    def _attach_stream(self, session: _Scope, prompt: np.ndarray) -> tuple[_Stream, int, int, bool]:
        """Find the stream the prompt continues (or start one) and index what is new.

        Returns ``(stream, new_tokens, reused_tokens, rewritten)``.
        """
        best: _Stream | None = None
        best_len = 0
        for stream in session.streams[-_STREAMS_COMPARED:]:
            n = stream.tokens.common_prefix_len(prompt)
            # Prefer an idle stream on equal overlap: it can be extended in place.
            if n > best_len or (n == best_len and best is not None and best.owner is not None):
                best, best_len = stream, n
        if best is not None and best.owner is None and best_len == len(best.tokens):
            # The usual agent turn: the prompt extends what the session already holds.
            tail = prompt[best_len:]
            best.tokens.append(tail)
            session.streams.remove(best)
            session.streams.append(best)
            new = self._add(session, session.stream, best.seq_id, tail)
            return best, new, best_len, False
        # The prompt diverges from every stream (history rewritten, output re-rendered,
        # or a concurrent call of the same session). Start a new sequence that repeats
        # ``max_depth`` tokens before the divergence, so every substring the tree can
        # match across the divergence point is indexed; the old text stays draftable.
        depth = self._depth
        stream = _Stream(session.stream.new_sequence(), TokenBuffer(prompt))
        session.streams.append(stream)
        resume = self._condensed_resume(best, prompt, best_len) if best is not None else None
        if resume is None:
            new = self._add(session, session.stream, stream.seq_id, prompt[max(0, best_len - depth) :])
            return stream, new, best_len, True
        # A condenser dropped turns from the middle: prompt[best_len:resume] is the end of
        # the old stream, which the tree holds. Index only the seam where it now starts and
        # what follows it (each with ``max_depth`` tokens of overlap).
        seam = session.stream.new_sequence()
        new = self._add(session, session.stream, seam, prompt[max(0, best_len - depth) : best_len + depth])
        new += self._add(session, session.stream, stream.seq_id, prompt[resume - depth :])
        return stream, new, best_len, True

    def _condensed_resume(self, old: _Stream, prompt: np.ndarray, diverged: int) -> int | None:
        """Where in ``prompt`` the old stream's text ends, if what comes between the
        divergence and there is the old stream's own end (turns dropped from the middle,
        the recent ones kept); None otherwise or when that saves too little to matter."""
        held = old.tokens.view()
        probe_len = min(self._depth, len(held))
        if probe_len == 0:
            return None
        at = find_last(prompt, held[len(held) - probe_len :], start=diverged)
        if at < 0:
            return None
        resume = at + probe_len
        span = resume - diverged
        if span <= 3 * self._depth or span > len(held):
            return None
        if not np.array_equal(prompt[diverged:resume], held[len(held) - span :]):
            return None
        return resume

    # ------------------------------------------------------------------ scopes and budgets

    def _scope(self, key: tuple[str, str]) -> _Scope:
        scope = self._scopes.get(key)
        if scope is None:
            return self._new_scope(key)
        self._scopes.move_to_end(key)
        return scope

    def _new_scope(self, key: tuple[str, str], ephemeral: bool = False) -> _Scope:
        scope = _Scope(
            key=key,
            stream=Corpus(self._depth),
            seeds=Corpus(self._depth),
            stats=SessionStats(scope_id=key[1]),
            ephemeral=ephemeral,
        )
        (self._ephemeral if ephemeral else self._scopes)[key] = scope
        return scope

    def _drop_scope(self, scope: _Scope) -> None:
        held = self._ephemeral if scope.ephemeral else self._scopes
        if held.pop(scope.key, None) is not None:
            self._scoped_tokens -= scope.tokens

    def _add(self, scope: _Scope, corpus: Corpus, seq_id: int, tokens: np.ndarray) -> int:
        n = corpus.extend(seq_id, tokens)
        self._scoped_tokens += n
        return n

    def _enforce_budgets(self, *touched: _Scope | None) -> None:
        """Bring every budget back within its limit; ``touched`` are the scopes that grew."""
        cfg = self.config
        while self._global.tokens > cfg.global_max_tokens:
            freed = self._global.drop_oldest(keep=self._global_active)
            if not freed:
                break
            self._evicted["tokens"] += freed
        for scope in touched:
            while scope is not None and scope.tokens > cfg.session_max_tokens:
                if not self._drop_oldest_text(scope):
                    break
        while self._scoped_tokens > cfg.sessions_max_tokens or len(self._scopes) > cfg.max_sessions:
            victim = next((s for s in self._scopes.values() if not s.active_calls), None)
            if victim is None:
                break  # everything is in use: over budget until calls finish
            self._drop_scope(victim)
            if victim.key[0] in self._evicted:
                self._evicted[victim.key[0]] += 1
            self._evicted["tokens"] += victim.tokens

    def _drop_oldest_text(self, scope: _Scope) -> bool:
        """Drop the scope's oldest sequence that no active call writes to; False if none."""
        if scope.key[0] == "group":
            busy = {c.group_seq for c in self._calls.values() if c.group is scope}
        else:
            busy = scope.busy_seqs()
        # Seeds go first: a session's own stream is what its next turn most likely repeats.
        for corpus, keep in ((scope.seeds, ()), (scope.stream, busy)):
            freed = corpus.drop_oldest(keep=keep)
            if freed:
                self._scoped_tokens -= freed
                self._evicted["tokens"] += freed
                scope.streams = [s for s in scope.streams if s.seq_id in scope.stream]
                return True
        return False

    # ------------------------------------------------------------------ validation

    def _call(self, call_id: Hashable) -> _Call:
        try:
            return self._calls[call_id]
        except (KeyError, TypeError):
            raise UnknownCallError(f"call {call_id!r} is not active (never started, or already finished)") from None

    @staticmethod
    def _check_hashable(value: object, what: str) -> None:
        try:
            hash(value)
        except TypeError:
            raise DraftIndexError(f"{what} must be hashable, got {type(value).__name__}") from None

    @staticmethod
    def _check_scope_id(value: object, what: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise DraftIndexError(f"{what} must be a non-empty string, got {value!r}")
        return value

    def _scope_stats(self, key: tuple[str, str]) -> SessionStats | None:
        scope = self._scopes.get(key)
        if scope is None:
            return None
        s = scope.stats
        return SessionStats(
            scope_id=s.scope_id,
            calls=s.calls,
            draft_steps=s.draft_steps,
            drafted_tokens=s.drafted_tokens,
            accepted_tokens=s.accepted_tokens,
            indexed_tokens=s.indexed_tokens,
            seeded_tokens=s.seeded_tokens,
            last_index_new_tokens=s.last_index_new_tokens,
            held_tokens=scope.tokens,
            group_id=s.group_id,
        )
