"""Draft what pays on this machine: drafts cut where their tokens stop paying for their time.

A step of ``B`` requests emits ``E`` tokens in ``T`` seconds. One more drafted token,
whose probability of being accepted (its path probability: it and every token before it
right) is ``p``, adds ``p`` expected tokens and ``per_token_s`` seconds
(:mod:`agentspec.draft_budget.step_cost`). It raises the step's tokens per second when::

    p / per_token_s > E / T,   that is   p > price = per_token_s * E / T

So each step's drafts stop where their path probability falls below ``price``, the output
tokens one verified token costs at this batch. On a GPU at small batches ``per_token_s``
is tiny beside ``T`` and drafts run long; on a CPU a verified token costs nearly a decoded
one and only near-certain tokens are drafted. As the batch grows, ``E / T`` grows and
drafts shorten, the batch rule's halving, found from the machine instead of fixed. A
model drafter's pass is priced alike: ``drafter_pass_s * E / T`` output tokens
(:meth:`CostBudget.pass_price`), which the hybrid weighs against what its drafts add.

``E / T`` comes from the last steps (emitted and verified tokens per request, smoothed)
and the fitted step cost at this batch; the cut is compared with the draft's calibrated
path probability (the index's level calibration), so an overconfident corpus is priced
as it is borne out.

Ranks of a tensor- or pipeline-parallel group that must draft alike (the hybrid's, whose
drafter passes hold collectives) cannot learn from their clocks, which differ: there the
budget does not learn (``learns=False``) and prices from its prior profile (a file the
operator gives, or the flat prior: nothing is cut) and from the emitted and verified
counts, which every rank sees alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from agentspec.draft_budget.step_cost import FLAT_PROFILE, StepCostEstimator, StepCostProfile

__all__ = ["CostBudget"]

#: Weight of the newest step in the running means of tokens per request and drafting time.
_SMOOTHING = 0.05


class CostBudget:
    """The draft budget that prices tokens by this engine's step cost (module docstring).

    ``max_tokens``: the longest draft (``num_speculative_tokens``); ``prior``: the step
    cost before any step is timed; ``explore_every``: one step in this many drafts
    unpriced, so that the fit keeps seeing long drafts (their time is what ``per_token_s``
    is learned from) and the hybrid keeps trying its model drafter, even where the price
    has cut every draft short.
    """

    calibrated_cut: ClassVar[bool] = True

    def __init__(
        self,
        max_tokens: int,
        prior: StepCostProfile = FLAT_PROFILE,
        *,
        learns: bool = True,
        explore_every: int = 32,
    ) -> None:
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if explore_every < 0:
            raise ValueError("explore_every must be >= 0 (0: never)")
        self.max_tokens = max_tokens
        self.estimator = StepCostEstimator(prior)
        self.learns = learns
        self.explore_every = explore_every
        #: Tokens a request emits and verifies per step, smoothed over the last steps.
        self.emitted_per_request = 1.0
        self.verified_per_request = 1.0
        #: Drafting's own seconds per step (the proposer's time), smoothed.
        self.drafting_s = 0.0
        self._steps = 0
        self._cut = 0.0
        self._price = 0.0

    # ------------------------------------------------------------------ DraftBudget

    def tokens_for(self, batch_size: int) -> int:
        """Every step may draft ``max_tokens``, unless no token can pay (price >= 1)."""
        self._steps += 1
        self._price = self.token_price(batch_size)
        if self.explore_every and self._steps % self.explore_every == 0:
            # A step whose full drafts teach: the fit (long drafts' time) and the hybrid's
            # estimate of a model drafter the price would never try. Every rank counts
            # steps alike, so every rank explores the same steps.
            self._cut = 0.0
            return self.max_tokens
        self._cut = min(self._price, 1.0)
        return 0 if self._price >= 1.0 else self.max_tokens

    def min_prob_for(self, batch_size: int) -> float:
        """The calibrated path probability below which the step's drafts stop: the price
        :meth:`tokens_for` found for it (0.0 on a step that explores)."""
        return self._cut

    def observe_draft(self, cap: int, drafted: int, accepted: int, probs: Sequence[float] = ()) -> None:
        """Drafts' fates reach the price through the emitted tokens of each step."""

    def observe_step(self, batch_size: int, context_tokens: float, drafter_s: float, drafting: bool) -> None:
        """The proposer's own time per request, the part of a step the fit does not time."""
        if self.learns and batch_size > 0:
            self.drafting_s += _SMOOTHING * (drafter_s * batch_size - self.drafting_s)

    def observe_timed_step(self, batch_size: int, verified: int, emitted: int, seconds: float | None) -> None:
        """A decoding step of ``batch_size`` requests verified ``verified`` tokens and
        emitted ``emitted``, in ``seconds`` (None: not timed, or not by this rank's clock)."""
        if batch_size <= 0:
            return
        self.emitted_per_request += _SMOOTHING * (emitted / batch_size - self.emitted_per_request)
        self.verified_per_request += _SMOOTHING * (verified / batch_size - self.verified_per_request)
        if self.learns and seconds is not None:
            self.estimator.observe(batch_size, verified, seconds)

    def observe_drafter(self, passes: int, seconds: float) -> None:
        """The model drafter's call took ``seconds`` with ``passes`` passes beyond its first."""
        if self.learns:
            self.estimator.observe_drafter(passes, seconds)

    # ------------------------------------------------------------------ prices

    @property
    def cost(self) -> StepCostProfile:
        """The step cost the prices read: fitted where the budget learns, else the prior."""
        return self.estimator.profile() if self.learns else self.estimator.prior

    @property
    def last_price(self) -> float:
        """The price of the step :meth:`tokens_for` was last asked about."""
        return self._price

    @property
    def exploring(self) -> bool:
        """Whether the step :meth:`tokens_for` was last asked about explores (drafts unpriced)."""
        return self._cut == 0.0

    def step_prices(self, batch_size: int) -> tuple[float, float]:
        """The step's price of a verified token and of a drafter pass, in output tokens,
        after :meth:`tokens_for` (both 0 on a step that explores)."""
        if self.exploring:
            return 0.0, 0.0
        return self._price, self.pass_price(batch_size)

    def _tokens_per_second(self, batch_size: int, cost: StepCostProfile) -> float:
        b = max(batch_size, 1)
        seconds = cost.step_seconds(b, b * self.verified_per_request) + self.drafting_s
        return b * self.emitted_per_request / seconds if seconds > 0 else 0.0

    def token_price(self, batch_size: int) -> float:
        """Output tokens one more verified token costs in a step of ``batch_size``: a draft
        token pays if its calibrated path probability is above this."""
        cost = self.cost
        return cost.per_token_s * self._tokens_per_second(batch_size, cost)

    def pass_price(self, batch_size: int) -> float:
        """Output tokens one autoregressive pass of the model drafter costs."""
        cost = self.cost
        return cost.drafter_pass_s * self._tokens_per_second(batch_size, cost)
