"""The index's value types: what its methods take and return.

Plain data, no behaviour beyond a derived rate: a :class:`Draft` and the :class:`Level` it
came from, what starting a call cost (:class:`CallStart`), the counters of one session or
group (:class:`ScopeStats`) and of the whole index (:class:`IndexStats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = ["CallStart", "Draft", "IndexStats", "Level", "ScopeStats", "cut_length"]


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


def cut_length(probs: Sequence[float], min_prob: float) -> int:
    """Tokens a draft keeps when it stops where its path probability (the estimated chance
    that it is right so far, which never rises along a draft) falls below ``min_prob``."""
    kept = 0
    for p in probs:
        if p < min_prob:
            break
        kept += 1
    return kept


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
class ScopeStats:
    """The counters of one scope, a session or a group, named by ``scope_id``.

    ``group_id`` is, for a session, the group of its latest call that named one; for a
    group, None.
    """

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
    #: Accepted draft tokens by the level that drafted them (call, session, group, global).
    accepted_tokens_by_level: dict[str, int] = field(default_factory=dict)
    #: Hybrid drafting: the draft model's drafts for the scope's calls (the counters above
    #: are the index's own).
    model_draft_steps: int = 0
    model_drafted_tokens: int = 0
    model_accepted_tokens: int = 0
    #: Seeded tokens by seed kind (prior_turn, repair_attempt, sibling_output, document).
    seeded_tokens_by_kind: dict[str, int] = field(default_factory=dict)
    #: RL: the policy version of the latest call that named one (``start_call``), and the
    #: drafted and accepted tokens by policy version (keys are the versions as text).
    policy_version: int | None = None
    drafted_tokens_by_policy_version: dict[str, int] = field(default_factory=dict)
    accepted_tokens_by_policy_version: dict[str, int] = field(default_factory=dict)

    def count_version(self, version: int, drafted: int, accepted: int) -> None:
        key = str(version)
        by_drafted, by_accepted = self.drafted_tokens_by_policy_version, self.accepted_tokens_by_policy_version
        by_drafted[key] = by_drafted.get(key, 0) + drafted
        by_accepted[key] = by_accepted.get(key, 0) + accepted

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
    #: 10% (see :meth:`agentspec.index.corpus.Corpus.memory_bytes`): cheap enough to poll.
    memory_bytes: int
    evicted_sessions: int
    evicted_groups: int
    evicted_tokens: int
    drafts_by_level: dict[str, int]
    drafted_tokens_by_level: dict[str, int]
    accepted_tokens_by_level: dict[str, int]
