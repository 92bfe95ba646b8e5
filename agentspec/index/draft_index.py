"""The :class:`DraftIndex` facade: calls, drafting across levels, seeds and statistics.

It owns the active calls, the global corpora, the per-level counters and the level
calibration; the sessions and groups live in a :class:`~agentspec.index.scopes.ScopeTable`,
and a session's streams are matched and extended by :mod:`agentspec.index.streams`.

Every call, seed and scope belongs to a *tenant* (``""`` unless given): a tenant's calls
draft only from its own sessions, groups and global corpus, and its own calibration
weighs them, so no text, and no acceptance statistic, of one tenant shapes another's
drafts. Who is a tenant is the caller's business (the engine derives it from the API key
and ``cache_salt``; one tenant for everyone is how an operator shares).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agentspec.errors import DraftIndexError, SeedLimitError, UnknownCallError
from agentspec.index.calibration import LevelCalibration
from agentspec.index.choice import Candidate, ChoiceContext, DraftChooser
from agentspec.index.corpus import EMPTY_TREE_DRAFT, Corpus, TreeDraft
from agentspec.index.policy import DraftPolicy, IndexConfig
from agentspec.index.scopes import Scope, ScopeKey, ScopeKind, ScopeTable
from agentspec.index.streams import Stream
from agentspec.index.tokens import as_token_array
from agentspec.index.types import (
    CallStart,
    Draft,
    IndexStats,
    Level,
    ScopeStats,
    cut_length,
)
from agentspec.wire import SeedKind

__all__ = ["DraftIndex"]


@dataclass(slots=True, eq=False)
class _Call:
    call_id: Hashable
    session: Scope
    stream: Stream
    group: Scope | None
    group_seq: int | None  # the sequence of the group's call text it appends to
    global_seq: int | None  # the sequence of its tenant's global corpus it appends to
    tenant: str = ""
    last_level: Level = Level.NONE
    last_probs: list[float] = field(default_factory=list)
    output_start: int = 0  # where the call's output begins in its stream
    policy_version: int | None = None  # the policy it runs under (RL), for statistics
    last_outcome: tuple[int, int] = (0, 0)  # the last verified draft: (drafted, accepted)


@dataclass(slots=True)
class _LevelCounts:
    """What one level supplied: drafts, their tokens, and the tokens the target accepted."""

    drafts: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0


class DraftIndex:
    """Session-aware suffix index: start a call, draft, extend with what was produced, finish.

    >>> index = DraftIndex()
    >>> _ = index.start_call("c1", [1, 2, 3, 4, 1, 2], session_id="s")
    >>> index.propose("c1").token_ids
    [3, 4, 1, 2]
    >>> index.finish_call("c1")
    """

    def __init__(self, config: IndexConfig | None = None, chooser: DraftChooser | None = None) -> None:
        """``chooser`` picks among the levels' drafts (default: the highest calibrated
        score, :func:`~agentspec.index.choice.by_calibrated_score`)."""
        self.config = config or IndexConfig()
        self._chooser = chooser
        self._max_depth = self.config.policy.max_depth
        self._calls: dict[Hashable, _Call] = {}
        self._scopes = ScopeTable(self.config)
        # Per tenant: its global corpus, the sequences of it active calls append to, and its
        # level calibration. ``global_max_tokens`` bounds the corpora together.
        self._global_text: dict[str, Corpus] = {}
        self._global_written: dict[str, set[int]] = {}
        self._global_evicted_tokens = 0
        self._level_counts = {lvl.value: _LevelCounts() for lvl in Level if lvl is not Level.NONE}
        #: Draft tokens a budget's probability cut took off (:meth:`propose`'s ``min_prob``).
        self.tokens_cut = 0
        self._calibrations: dict[str, LevelCalibration] = {}

    # ------------------------------------------------------------------ calls

    def start_call(
        self,
        call_id: Hashable,
        prompt: Sequence[int] | np.ndarray,
        *,
        session_id: str | None = None,
        group_id: str | None = None,
        tenant: str = "",
        policy_version: int | None = None,
    ) -> CallStart:
        """Begin a call of ``tenant``; index the part of ``prompt`` the session does not hold yet.

        ``policy_version`` (RL: the weights it runs under) only labels its statistics.
        """
        self._check_hashable(call_id, "call_id")
        if call_id in self._calls:
            raise DraftIndexError(f"call {call_id!r} is already active")
        session_key = self._check_scope_id(session_id, "session_id")
        group_key = self._check_scope_id(group_id, "group_id")
        tokens = as_token_array(prompt, "prompt")

        tenant = self._check_tenant(tenant)
        if session_key is None:
            session = self._scopes.new_call_scope()
        else:
            session = self._scopes.use(ScopeKey(ScopeKind.SESSION, session_key, tenant))
        if group_key is not None and group_key == session_key:
            group_key = None  # a session that is its own group has no separate group level
        group = self._scopes.use(ScopeKey(ScopeKind.GROUP, group_key, tenant)) if group_key is not None else None
        if group is not None:
            session.stats.group_id = group_key

        self._scopes.call_started(session, group)
        stream, start = self._scopes.attach_stream(session, tokens)
        stream.writer = call_id
        session.stats.indexed_tokens += start.new_tokens

        call = _Call(call_id, session, stream, group, None, None, tenant=tenant, output_start=len(stream.tokens))
        call.policy_version = policy_version
        if group is not None:
            call.group_seq = group.call_text.new_sequence()
            group.active_calls[call_id] = call.group_seq
            group.stats.calls += 1
        if self._feeds_global(call):
            call.global_seq = self._global_corpus(tenant).new_sequence()
            self._global_written[tenant].add(call.global_seq)
        session.active_calls[call_id] = stream.seq_id
        session.stats.calls += 1
        session.stats.last_index_new_tokens = start.new_tokens
        if policy_version is not None:
            session.stats.policy_version = policy_version
        self._calls[call_id] = call
        self._enforce_budgets(session, group)
        return start

    def extend_call(self, call_id: Hashable, tokens: Sequence[int] | np.ndarray) -> None:
        """Append tokens the call produced to its context and to the corpora it feeds."""
        call = self._call(call_id)
        arr = as_token_array(tokens, "output tokens")
        if not len(arr):
            return
        call.stream.tokens.append(arr)
        n = self._scopes.add_text(call.session.call_text, call.stream.seq_id, arr)
        call.session.stats.indexed_tokens += n
        if call.group is not None and call.group_seq is not None:
            self._scopes.add_text(call.group.call_text, call.group_seq, arr)
        if call.global_seq is not None:
            self._global_text[call.tenant].extend(call.global_seq, arr)
        self._enforce_budgets(call.session, call.group)

    def propose(
        self, call_id: Hashable, max_tokens: int | None = None, min_prob: float = 0.0, *, calibrated: bool = False
    ) -> Draft:
        """The best draft for the call's current context, at most ``max_tokens`` long and
        stopped where its path probability falls below ``min_prob`` (a batch budget's cut;
        the policy's ``min_token_prob`` applies as well). With ``calibrated``, the cut
        compares ``min_prob`` with the path probability weighted by the level's calibration
        (what the target bore out of that level's estimates)."""
        call = self._call(call_id)
        policy = self.config.policy
        budget = policy.max_spec_tokens if max_tokens is None else min(max_tokens, policy.max_spec_tokens)
        if budget <= 0:
            call.last_level = Level.NONE
            return Draft.empty()
        context = call.stream.tokens.tail(min(self._max_depth, policy.max_match_tokens))
        best, level = self._best_draft(call, context, budget)
        if min_prob > policy.min_token_prob and level is not Level.NONE:
            threshold = min_prob
            if calibrated:
                calibration = self._calibration(call.tenant)
                weight = 1.0 if calibration is None else calibration.weight(level.value)
                threshold = min_prob / weight if weight > 0 else float("inf")
            kept = cut_length(best.probs, threshold)
            if kept < len(best.token_ids):
                self.tokens_cut += len(best.token_ids) - kept
                probs = best.probs[:kept]
                best = TreeDraft(best.token_ids[:kept], probs, float(sum(probs)), best.match_len)
                level = level if kept else Level.NONE
        call.last_level = level
        call.last_probs = best.probs
        if level is Level.NONE:
            return Draft.empty()
        counts = self._level_counts[level.value]
        counts.drafts += 1
        counts.drafted_tokens += len(best.token_ids)
        return Draft(best.token_ids, best.probs, best.score, best.match_len, level)

    def record_model_verification(self, call_id: Hashable, drafted: int, accepted: int) -> None:
        """Record, in the call's session and group stats, a model drafter's draft (hybrid
        drafting) of ``drafted`` tokens of which the target accepted ``accepted``."""
        call = self._call(call_id)
        if not 0 <= accepted <= drafted:
            raise DraftIndexError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        for scope in (call.session, call.group):
            if scope is not None and drafted:
                scope.stats.model_draft_steps += 1
                scope.stats.model_drafted_tokens += drafted
                scope.stats.model_accepted_tokens += accepted

    def withdraw_draft(self, call_id: Hashable) -> None:
        """Take back the call's last draft: it was not sent for verification (another
        drafter's was, in the hybrid), so it counts as neither proposed nor verified."""
        call = self._call(call_id)
        if call.last_level is not Level.NONE:
            counts = self._level_counts[call.last_level.value]
            counts.drafts -= 1
            counts.drafted_tokens -= len(call.last_probs)
        call.last_level = Level.NONE
        call.last_probs = []

    def record_verification(self, call_id: Hashable, drafted: int, accepted: int) -> None:
        """Record how many of the last draft's tokens the target model accepted."""
        call = self._call(call_id)
        if not 0 <= accepted <= drafted:
            raise DraftIndexError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        if drafted == 0:
            return
        call.last_outcome = (drafted, accepted)
        for scope in (call.session, call.group):
            if scope is not None:
                scope.stats.draft_steps += 1
                scope.stats.drafted_tokens += drafted
                scope.stats.accepted_tokens += accepted
                if call.policy_version is not None:
                    scope.stats.count_version(call.policy_version, drafted, accepted)
        if call.last_level is not Level.NONE:
            level = call.last_level.value
            self._level_counts[level].accepted_tokens += accepted
            for scope in (call.session, call.group):
                if scope is not None:
                    by_level = scope.stats.accepted_tokens_by_level
                    by_level[level] = by_level.get(level, 0) + accepted
            calibration = self._calibration(call.tenant)
            if calibration is not None:
                calibration.observe(level, sum(call.last_probs[:drafted]), accepted)

    def finish_call(self, call_id: Hashable) -> None:
        """Release a call, finished or aborted. Its text stays in its session and corpora."""
        call = self._calls.pop(call_id, None)
        if call is None:
            raise UnknownCallError(f"call {call_id!r} is not active (never started, or already finished)")
        call.stream.writer = None
        call.session.active_calls.pop(call_id, None)
        self._scopes.call_finished(call.session)
        if call.group is not None:
            call.group.active_calls.pop(call_id, None)
            self._scopes.call_finished(call.group)
        if call.global_seq is not None:
            self._global_written[call.tenant].discard(call.global_seq)
        if call.session.ephemeral:
            self._scopes.drop(call.session)
        self._enforce_budgets()

    def retire_outputs(self) -> int:
        """Forget what calls generated at the group and global levels, for a new policy
        (RL weights): its outputs will differ from the old one's. Groups keep their seeds;
        sessions keep their own text (it is their context). Calls in flight finish as they
        started but no longer feed, nor draft from, those levels. Returns the tokens forgotten.
        """
        retired = sum(self._scopes.clear_call_text(group) for group in self._scopes.groups())
        for tenant, corpus in self._global_text.items():
            retired += corpus.tokens
            self._global_text[tenant] = Corpus(self._max_depth)
            self._global_written[tenant] = set()
        for call in self._calls.values():
            call.group_seq = None
            call.global_seq = None
        return retired

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

    def add_peer_output(self, tokens: Sequence[int] | np.ndarray, *, tenant: str = "") -> int:
        """Put a finished output of another replica into ``tenant``'s global corpus (oldest
        text is dropped first beyond ``global_max_tokens``, as for local outputs). Returns
        the number of tokens added; 0 when the global corpus is off."""
        arr = as_token_array(tokens, "peer output tokens")
        tenant = self._check_tenant(tenant)
        if not len(arr) or self.config.global_max_tokens == 0:
            return 0
        corpus = self._global_corpus(tenant)
        n = corpus.extend(corpus.new_sequence(), arr)
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
        tenant: str = "",
    ) -> int:
        """Put ``tokens`` into a session's or a group's index (of ``tenant``) without generating them.

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
        tenant = self._check_tenant(tenant)
        if session_key is not None:
            key = ScopeKey(ScopeKind.SESSION, session_key, tenant)
        else:
            assert group_key is not None  # checked above: one of the two is given
            key = ScopeKey(ScopeKind.GROUP, group_key, tenant)
        existing = self._scopes.get(key)
        already = existing.stats.seeded_tokens if existing is not None else 0
        if already + len(arr) > cfg.seed_max_total_tokens:
            raise SeedLimitError(
                f"seeding {len(arr)} tokens would bring {key.kind} {key.id!r} to {already + len(arr)}"
                f" seeded tokens, over seed_max_total_tokens={cfg.seed_max_total_tokens}"
            )
        if not len(arr):
            return 0
        scope = self._scopes.use(key)
        self._scopes.add_text(scope.seed_text, scope.seed_text.new_sequence(), arr)
        scope.stats.seeded_tokens += len(arr)
        by_kind = scope.stats.seeded_tokens_by_kind
        by_kind[kind.value] = by_kind.get(kind.value, 0) + len(arr)
        self._enforce_budgets(scope)
        return len(arr)

    # ------------------------------------------------------------------ introspection

    def session_stats(self, session_id: str, tenant: str = "") -> ScopeStats | None:
        """A copy of a session's counters, or ``None`` if the index holds no such session."""
        return self._scope_stats(ScopeKey(ScopeKind.SESSION, session_id, tenant))

    def group_stats(self, group_id: str, tenant: str = "") -> ScopeStats | None:
        """A copy of a group's counters, or ``None`` if the index holds no such group."""
        return self._scope_stats(ScopeKey(ScopeKind.GROUP, group_id, tenant))

    def stats(self) -> IndexStats:
        scopes = self._scopes
        sessions, groups, call_scopes = scopes.sessions(), scopes.groups(), scopes.call_scopes()
        memory = sum(c.memory_bytes() for c in self._global_text.values()) + sum(
            s.call_text.memory_bytes() + s.seed_text.memory_bytes() for s in scopes
        )
        counts = self._level_counts
        return IndexStats(
            sessions=len(sessions),
            groups=len(groups),
            active_calls=len(self._calls),
            session_tokens=sum(s.tokens for s in sessions) + sum(s.tokens for s in call_scopes),
            group_tokens=sum(s.tokens for s in groups),
            global_tokens=self._global_tokens(),
            memory_bytes=memory,
            evicted_sessions=scopes.evicted_sessions,
            evicted_groups=scopes.evicted_groups,
            evicted_tokens=scopes.evicted_tokens + self._global_evicted_tokens,
            drafts_by_level={k: c.drafts for k, c in counts.items()},
            drafted_tokens_by_level={k: c.drafted_tokens for k, c in counts.items()},
            accepted_tokens_by_level={k: c.accepted_tokens for k, c in counts.items()},
        )

    def level_weights(self, tenant: str = "") -> dict[str, float]:
        """The weight each level's draft scores get, for ``tenant``, when levels compete (see
        :mod:`agentspec.index.calibration`); empty when ``calibrate_levels`` is off or nothing
        was verified yet."""
        calibration = self._calibrations.get(tenant)
        return calibration.weights() if calibration is not None else {}

    def expected_accepted(self, draft: Draft, tenant: str = "") -> float:
        """The tokens ``draft`` is expected to deliver: its score weighted by its level's
        calibration for ``tenant``, as the index ranks drafts (the hybrid compares this
        with a model drafter's expectation)."""
        if not draft.token_ids:
            return 0.0
        return draft.score * self.level_weights(tenant).get(draft.level.value, 1.0)

    @property
    def held_tokens(self) -> int:
        """Tokens held by every tree of the index."""
        return self._scopes.held_tokens + self._global_tokens()

    # ------------------------------------------------------------------ drafting

    def level_drafts(self, call_id: Hashable, policy: DraftPolicy | None = None) -> list[Draft]:
        """Every tree's draft for the call's current context, most specific level first,
        under ``policy`` (the index's own when None), without choosing or counting.

        For analysis (``benchmarks/choice_headroom.py``): :meth:`propose` returns the one of
        these with the highest calibrated score.
        """
        call = self._call(call_id)
        policy = policy or self.config.policy
        context = call.stream.tokens.tail(min(self._max_depth, policy.max_match_tokens))
        drafts = []
        for corpus, level in self._candidate_trees(call):
            d = corpus.speculate(context, policy.max_spec_tokens, policy)
            if d.token_ids:
                drafts.append(Draft(d.token_ids, d.probs, d.score, d.match_len, level))
        return drafts

    def _candidate_trees(self, call: _Call) -> list[tuple[Corpus, Level]]:
        candidates: list[tuple[Corpus, Level]] = [
            (call.session.call_text, Level.CALL),
            (call.session.seed_text, Level.SESSION),
        ]
        if call.group is not None:
            candidates += [(call.group.call_text, Level.GROUP), (call.group.seed_text, Level.GROUP)]
        if self._drafts_from_global(call) and call.global_seq is not None:
            candidates.append((self._global_text[call.tenant], Level.GLOBAL))
        return candidates

    def _best_draft(self, call: _Call, context: np.ndarray, budget: int) -> tuple[TreeDraft, Level]:
        if self._chooser is not None:
            return self._chosen_draft(call, context, budget)
        policy = self.config.policy
        calibration = self._calibration(call.tenant)
        # by_calibrated_score, inline: this runs for every request at every decoding step, and
        # a Candidate per level showed in the proposer's time per step.
        best, best_level, best_score = EMPTY_TREE_DRAFT, Level.NONE, 0.0
        for corpus, level in self._candidate_trees(call):
            d = corpus.speculate(context, budget, policy)
            if not d.token_ids:
                continue
            score = d.score if calibration is None else d.score * calibration.weight(level.value)
            if best_level is Level.NONE or score > best_score:
                best, best_level, best_score = d, level, score
        return best, best_level

    def _chosen_draft(self, call: _Call, context: np.ndarray, budget: int) -> tuple[TreeDraft, Level]:
        """The draft the configured chooser picks among every level's."""
        assert self._chooser is not None
        policy = self.config.policy
        calibration = self._calibration(call.tenant)
        candidates = []
        for corpus, level in self._candidate_trees(call):
            d = corpus.speculate(context, budget, policy)
            if d.token_ids:
                weight = 1.0 if calibration is None else calibration.weight(level.value)
                candidates.append(Candidate(d, level, weight))
        position = len(call.stream.tokens) - call.output_start
        chosen = self._chooser.choose(candidates, ChoiceContext(position, *call.last_outcome)) if candidates else -1
        if chosen < 0:
            return EMPTY_TREE_DRAFT, Level.NONE
        return candidates[chosen].draft, candidates[chosen].level

    def _feeds_global(self, call: _Call) -> bool:
        if self.config.global_max_tokens == 0:
            return False
        return not (self.config.isolate_groups and call.group is not None)

    def _drafts_from_global(self, call: _Call) -> bool:
        return self._feeds_global(call)

    # ------------------------------------------------------------------ budgets

    def _global_corpus(self, tenant: str) -> Corpus:
        corpus = self._global_text.get(tenant)
        if corpus is None:
            corpus = self._global_text[tenant] = Corpus(self._max_depth)
            self._global_written[tenant] = set()
        return corpus

    def _global_tokens(self) -> int:
        return sum(c.tokens for c in self._global_text.values())

    def _calibration(self, tenant: str) -> LevelCalibration | None:
        if not self.config.policy.calibrate_levels:
            return None
        calibration = self._calibrations.get(tenant)
        if calibration is None:
            calibration = self._calibrations[tenant] = LevelCalibration()
        return calibration

    def _enforce_budgets(self, *touched: Scope | None) -> None:
        """Bring every budget back within its limit; ``touched`` are the scopes that grew."""
        total = self._global_tokens()
        while total > self.config.global_max_tokens:
            # The tenant holding the most global text gives up its oldest first.
            freed = 0
            for tenant in sorted(self._global_text, key=lambda t: -self._global_text[t].tokens):
                freed = self._global_text[tenant].drop_oldest(keep=self._global_written[tenant])
                if freed:
                    break
            if not freed:
                break  # everything is in use: over budget until calls finish
            self._global_evicted_tokens += freed
            total -= freed
        self._scopes.enforce_budgets(*touched)

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
    def _check_tenant(value: object) -> str:
        if not isinstance(value, str):
            raise DraftIndexError(f"tenant must be a string, got {value!r}")
        return value

    @staticmethod
    def _check_scope_id(value: object, what: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise DraftIndexError(f"{what} must be a non-empty string, got {value!r}")
        return value

    def _scope_stats(self, key: ScopeKey) -> ScopeStats | None:
        scope = self._scopes.get(key)
        if scope is None:
            return None
        s = scope.stats
        return ScopeStats(
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
            accepted_tokens_by_level=dict(s.accepted_tokens_by_level),
            seeded_tokens_by_kind=dict(s.seeded_tokens_by_kind),
            policy_version=s.policy_version,
            drafted_tokens_by_policy_version=dict(s.drafted_tokens_by_policy_version),
            accepted_tokens_by_policy_version=dict(s.accepted_tokens_by_policy_version),
            model_draft_steps=s.model_draft_steps,
            model_drafted_tokens=s.model_drafted_tokens,
            model_accepted_tokens=s.model_accepted_tokens,
        )
