"""One stream of requests through the draft index: what the server and the replay both run.

The vLLM proposers (:mod:`agentspec.engine.worker.drafting`) and the replay benchmark's
``agentspec`` proposer drive the index only through :class:`RequestDriver`, so a replay
figure comes from the server's own drafting logic: the same seeds, the same clipping at a
request's stop, the same verification records (which calibrate the levels) and the same
batch budget. Per request::

    admit(req_id, RequestSpec)        seeds go in at once; a seed-only request is never drafted
    begin(req_id, prompt, generated)  its prompt is indexed (only what its session lacks)
    verified(req_id, accepted)        how much of its last draft the target accepted
    advance(req_id, emitted)          the tokens a step emitted, clipped at the stop
    draft(req_id, max_tokens)         the next draft, or None
    release(req_id)                   finished or aborted

Like the index it imports nothing of vLLM, HTTP or a framework, and is single-threaded.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from agentspec.draft_budget.batch_budget import DraftBudget
from agentspec.errors import DraftIndexError
from agentspec.index import CallStart, Draft, DraftIndex
from agentspec.wire import SeedKind, SeedScope

#: Per-draft distributions a driver keeps (see :class:`RequestDriver`).
DISTRIBUTIONS = ("draft_length", "accepted_tokens_per_draft")

__all__ = ["RequestDriver", "RequestSpec", "SeedOutcome", "TokenSeed"]


@dataclass(frozen=True, slots=True)
class TokenSeed:
    """A seed as the engine receives it: token ids, where they go and why."""

    token_ids: tuple[int, ...]
    scope: SeedScope = SeedScope.SESSION
    kind: SeedKind = SeedKind.PRIOR_TURN


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What is known of a request when it arrives."""

    session_id: str | None = None
    group_id: str | None = None
    #: Whose text it may draft from and feeds (see agentspec.index); "" is the default tenant.
    tenant: str = ""
    seeds: tuple[TokenSeed, ...] = ()
    #: The scheduler's stop conditions, so the index holds exactly the output the client
    #: gets: in the step a request finishes, the engine still reports every accepted token.
    max_tokens: int | None = None
    stop_ids: frozenset[int] = frozenset()
    #: It only carries seeds (``POST /agentspec/v1/seeds``): its own tokens are not the
    #: session's text, so it is neither indexed nor drafted.
    seed_only: bool = False
    #: It announces a new policy version (``POST /agentspec/v1/policy``, RL weight
    #: updates); like a seed-only request it is neither indexed nor drafted.
    policy_version: int | None = None
    keep_old_outputs: bool = False


@dataclass(slots=True)
class _Request:
    spec: RequestSpec
    begun: bool = False
    disabled: bool = False  # the index refused it, or it is seed-only: no drafts
    done: bool = False  # its stop was emitted
    output_len: int = 0
    last_draft_len: int = 0
    last_cap: int = 0  # the cap its last draft was asked with
    last_probs: list[float] = field(default_factory=list)  # its last draft's path probabilities
    teaches: bool = False  # its last draft may teach the batch budget
    policy_version: int | None = None  # live when it arrived: it runs under that one

    def keepable(self, tokens: Iterable[int]) -> int:
        """How many of ``tokens`` :meth:`clip` would keep (without keeping them)."""
        spec, length, n = self.spec, self.output_len, 0
        if self.done:
            return 0
        for tok in map(int, tokens):
            n += 1
            length += 1
            if tok in spec.stop_ids or (spec.max_tokens is not None and length >= spec.max_tokens):
                break
        return n

    def clip(self, tokens: Iterable[int]) -> list[int]:
        """The prefix of newly emitted ``tokens`` the scheduler keeps."""
        kept: list[int] = []
        spec = self.spec
        for tok in map(int, tokens):
            if self.done:
                break
            kept.append(tok)
            self.output_len += 1
            if tok in spec.stop_ids or (spec.max_tokens is not None and self.output_len >= spec.max_tokens):
                self.done = True
        return kept


@dataclass(slots=True)
class SeedOutcome:
    """What :meth:`RequestDriver.admit` did with a request's seeds."""

    seeded_tokens: int = 0
    refused: list[tuple[TokenSeed, str]] = field(default_factory=list)
    """Seeds the index refused (over its budgets), with the reason."""


class RequestDriver:
    """Drives one :class:`~agentspec.index.DraftIndex` for a stream of requests.

    ``budget`` limits draft length by batch size (:meth:`budget_for`); ``counters`` add up
    what the engine publishes (``calls_started_total``, ``seeded_tokens_total``, ...), and
    ``distributions`` count exact values per draft (``draft_length``: tokens proposed,
    zero when nothing matched; ``accepted_tokens_per_draft``: tokens the target accepted
    of a non-empty draft).
    Errors of the index (:class:`~agentspec.errors.DraftIndexError`) propagate: the caller
    decides whether to :meth:`disable` the request.
    """

    def __init__(self, index: DraftIndex, budget: DraftBudget | None = None) -> None:
        self.index = index
        self.budget = budget
        self.counters: dict[str, float] = {}
        self.distributions: dict[str, Counter[int]] = {name: Counter() for name in DISTRIBUTIONS}
        self._requests: dict[str, _Request] = {}
        #: The live policy version (None until one is announced).
        self.policy_version: int | None = None
        #: Outputs of versions below this one are retired (None: none are).
        self.retired_below: int | None = None
        #: The batch budget's probability cut for the current step (0.0: none).
        self.min_prob = 0.0
        #: Whether the cut compares calibrated path probabilities (the budget's choice).
        self.calibrated_cut = budget is not None and budget.calibrated_cut
        # (tenant, session) seen recently, most recent last; bounded like the index's own LRU.
        self._sessions: OrderedDict[tuple[str, str], None] = OrderedDict()

    # ------------------------------------------------------------------ lifecycle

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._requests

    def admit(self, req_id: str, spec: RequestSpec) -> SeedOutcome:
        """A request arrived: apply its seeds now, before its first draft."""
        self._requests[req_id] = req = _Request(spec, policy_version=self.policy_version)
        outcome = SeedOutcome()
        for seed in spec.seeds:
            # A request without a group is its own group: group seeds go to its session.
            target = (spec.group_id or spec.session_id) if seed.scope is SeedScope.GROUP else spec.session_id
            if target is None:
                continue  # the wire refuses this; a direct vllm_xargs user gets no seed
            where = {"group_id": target} if seed.scope is SeedScope.GROUP and spec.group_id else {"session_id": target}
            try:
                n = self.index.seed(seed.token_ids, kind=seed.kind, tenant=spec.tenant, **where)
            except DraftIndexError as exc:
                outcome.refused.append((seed, str(exc)))
                self._count("seed_errors_total")
                continue
            outcome.seeded_tokens += n
            self._count("seeded_tokens_total", n)
            if spec.session_id is not None:
                self.touch_session(spec.session_id, spec.tenant)
        if spec.policy_version is not None:
            self.set_policy_version(spec.policy_version, keep_old_outputs=spec.keep_old_outputs)
            req.disabled = True
        elif spec.seed_only:
            req.disabled = True
            self._count("seed_only_requests_total")
        return outcome

    def set_policy_version(self, version: int, *, keep_old_outputs: bool = False) -> int:
        """A new policy is live: later requests run under it and, unless
        ``keep_old_outputs``, what older versions generated stops drafting at the group and
        global levels (:meth:`DraftIndex.retire_outputs`). Versions only move forward: an
        older or equal one changes nothing. Returns the tokens retired."""
        if self.policy_version is not None and version <= self.policy_version:
            return 0
        self.policy_version = version
        self.counters["policy_version"] = version
        self._count("policy_updates_total")
        retired = 0
        if not keep_old_outputs:
            self.retired_below = version
            retired = self.index.retire_outputs()
        self._count("retired_output_tokens_total", retired)
        return retired

    def is_draftable_version(self, version: int | None) -> bool:
        """Whether an output generated under policy ``version`` (None: before any was
        announced) may still draft at the group and global levels, e.g. a peer replica's."""
        return self.retired_below is None or (version is not None and version >= self.retired_below)

    def request_policy_version(self, req_id: str) -> int | None:
        """The policy version the request runs under (live when it arrived)."""
        req = self._requests.get(req_id)
        return req.policy_version if req is not None else None

    def begin(self, req_id: str, prompt: np.ndarray | Sequence[int], generated: Sequence[int] = ()) -> CallStart | None:
        """Index the request's prompt, and whatever it generated before it was first seen."""
        req = self._request(req_id)
        req.begun = True
        if req.disabled:
            return None
        spec = req.spec
        start = self.index.start_call(
            req_id,
            prompt,
            session_id=spec.session_id,
            group_id=spec.group_id,
            tenant=spec.tenant,
            policy_version=req.policy_version,
        )
        if kept := req.clip(generated):
            self.index.extend_call(req_id, kept)
        self._count("calls_started_total")
        self._count("index_new_tokens_total", start.new_tokens)
        self._count("index_reused_tokens_total", start.reused_tokens)
        if spec.session_id is not None:
            self.touch_session(spec.session_id, spec.tenant)
        return start

    def begun(self, req_id: str) -> bool:
        req = self._requests.get(req_id)
        return req is not None and req.begun

    def verified(self, req_id: str, accepted: int, emitted: Sequence[int] | None = None) -> None:
        """The target accepted ``accepted`` tokens of the request's last draft.

        ``emitted``: the step's tokens (accepted draft tokens and the bonus token). Those
        past the request's stop or ``max_tokens`` are dropped by the engine, so accepted
        tokens among them are not counted: a draft is credited only with what it delivered.
        """
        req = self._request(req_id)
        if req.disabled or not req.last_draft_len:
            return
        drafted = req.last_draft_len
        if emitted is not None:
            accepted = min(accepted, req.keepable(emitted))
        accepted = max(0, min(accepted, drafted))
        self.index.record_verification(req_id, drafted, accepted)
        self.distributions["accepted_tokens_per_draft"][accepted] += 1
        if self.budget is not None and req.teaches:
            self.budget.observe_draft(req.last_cap, drafted, accepted, req.last_probs)

    def advance(self, req_id: str, emitted: Iterable[int]) -> None:
        """The tokens one step emitted (accepted draft tokens and the bonus token)."""
        req = self._request(req_id)
        if req.disabled:
            return
        self.index.extend_call(req_id, req.clip(emitted))

    def spec(self, req_id: str) -> RequestSpec | None:
        req = self._requests.get(req_id)
        return req.spec if req is not None else None

    def last_draft_len(self, req_id: str) -> int:
        req = self._requests.get(req_id)
        return req.last_draft_len if req is not None else 0

    def draft(self, req_id: str, max_tokens: int | None = None) -> Draft | None:
        """The next draft, at most ``max_tokens`` long (None: the policy's maximum).

        None when the request is disabled, has emitted its stop, or may not draft.
        """
        req = self._request(req_id)
        if req.disabled or req.done or (max_tokens is not None and max_tokens <= 0):
            req.last_draft_len = 0
            return None
        draft = self.index.propose(req_id, max_tokens, self.min_prob, calibrated=self.calibrated_cut)
        req.last_draft_len = len(draft.token_ids)
        self.distributions["draft_length"][req.last_draft_len] += 1
        if self.min_prob:
            self.counters["budget_cut_tokens_total"] = self.index.tokens_cut
        # A draft under the step's probability cut teaches the budget nothing (as a capped
        # one teaches nothing): it cannot tell what the cut took off.
        req.teaches = self.budget is not None and self.min_prob == 0.0
        if req.teaches:
            assert self.budget is not None
            req.last_cap = self.budget.max_tokens if max_tokens is None else max_tokens
            req.last_probs = draft.probs
            if not req.last_draft_len:
                self.budget.observe_draft(req.last_cap, 0, 0)  # nothing to verify
        return draft

    def may_draft(self, req_id: str) -> bool:
        """Whether any drafter may draft for the request: it has not emitted its stop."""
        req = self._requests.get(req_id)
        return req is None or not req.done

    def withdraw(self, req_id: str) -> None:
        """The request's last draft will not be verified (the hybrid sent a model
        drafter's instead): it is taken back from the index and the statistics."""
        req = self._requests.get(req_id)
        if req is None or not req.last_draft_len:
            return
        lengths = self.distributions["draft_length"]
        lengths[req.last_draft_len] -= 1
        if not lengths[req.last_draft_len]:
            del lengths[req.last_draft_len]
        req.last_draft_len = 0
        if self.index.has_call(req_id):
            self.index.withdraw_draft(req_id)

    def disable(self, req_id: str) -> None:
        """Run the request without speculation from now on (e.g. the index refused it)."""
        req = self._requests.setdefault(req_id, _Request(RequestSpec()))
        req.disabled = True
        req.last_draft_len = 0
        if self.index.has_call(req_id):
            self.index.finish_call(req_id)

    def release(self, req_id: str, *, share: bool = False) -> np.ndarray | None:
        """The request finished or was aborted. With ``share``, its output as other replicas
        may index it (None where it must not leave this server)."""
        self._requests.pop(req_id, None)
        if not self.index.has_call(req_id):
            return None
        out = self.index.shared_output(req_id) if share else None
        self.index.finish_call(req_id)
        self._count("calls_finished_total")
        return out

    # ------------------------------------------------------------------ batch budget

    def budget_for(self, batch_size: int, max_tokens: int) -> int:
        """Draft tokens per request when ``batch_size`` requests share one step; the
        budget's probability cut for the step applies to the drafts that follow
        (:attr:`min_prob`)."""
        budget = max_tokens if self.budget is None else min(self.budget.tokens_for(batch_size), max_tokens)
        self.min_prob = 0.0 if self.budget is None or not budget else self.budget.min_prob_for(batch_size)
        self.counters["draft_budget"] = budget
        self.counters["draft_min_prob"] = self.min_prob
        self.counters["batch_size"] = batch_size
        if self.budget is not None and budget < self.budget.max_tokens:
            self._count("budget_off_steps_total" if budget == 0 else "budget_limited_steps_total")
        return budget

    # ------------------------------------------------------------------ statistics

    def touch_session(self, session_id: str, tenant: str = "") -> None:
        key = (tenant, session_id)
        self._sessions[key] = None
        self._sessions.move_to_end(key)
        while len(self._sessions) > self.index.config.max_sessions:
            self._sessions.popitem(last=False)

    def recent_sessions(self) -> Iterator[tuple[str, str]]:
        """``(tenant, session)`` seen recently that the index still holds, oldest first."""
        for key in list(self._sessions):
            if self.index.session_stats(key[1], key[0]) is None:  # evicted by the index
                del self._sessions[key]
                continue
            yield key

    def _count(self, key: str, n: float = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def _request(self, req_id: str) -> _Request:
        req = self._requests.get(req_id)
        if req is None:
            # Not announced (a replay or engine that skipped admit): draft it as vLLM's
            # suffix method would, from the call itself and the global corpus.
            req = self._requests[req_id] = _Request(RequestSpec())
        return req
