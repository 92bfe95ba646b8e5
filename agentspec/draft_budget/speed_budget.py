"""Draft limits chosen by the speed model, from the engine's own drafts.

``agentspec serve --agentspec-speed-model GPU:MODEL`` replaces the fixed batch rule
(:class:`agentspec.draft_budget.batch_budget.BatchBudget`) with :class:`SpeedBudget`. At each batch size it
limits drafts two ways, to what :mod:`agentspec.draft_budget.speed_model` estimates fastest: a cap on their
length, and a path probability below which they stop (one of
:data:`CUT_PROBS`). Verifying a token costs more as the batch grows, so
at large batches a draft's unlikely tail stops paying for itself before its length does.
The estimate uses three things this engine measured:

- how its drafts fared: ``(drafted, accepted)`` per request and step, and what each
  probability cut would have kept of them;
- the mean context of its running requests;
- the drafter's own time per request and step.

A draft cut short and wholly accepted might have gone on, so it says nothing about longer
drafts. Only full-length, uncut steps teach: every step during the warm-up, then one step
in ``explore_every``. Counts are halved when they pass ``window`` proposals, so the
estimate follows the traffic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import ClassVar, NamedTuple

from agentspec.draft_budget.speed_model import DraftOutcomes, SpeedModel
from agentspec.index.types import cut_length

__all__ = ["CUT_PROBS", "DraftLimits", "SpeedBudget", "fastest_limits"]

#: Path probabilities a draft may be cut at, besides its policy's own (0.0: no further cut).
#: A draft's path probabilities never rise along it, so a cut keeps a prefix.
CUT_PROBS: tuple[float, ...] = (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)

#: Weight of the newest step in the running means of context and drafter time.
_SMOOTHING = 0.05


class DraftLimits(NamedTuple):
    """A step's limits on each draft: at most ``tokens``, stopped below ``min_prob``."""

    tokens: int
    min_prob: float
    #: The speed model's estimate of output tokens/s under these limits.
    tokens_per_s: float


def fastest_limits(
    model: SpeedModel,
    batch_size: int,
    context_tokens: float,
    outcomes_by_cut: Mapping[float, DraftOutcomes],
    drafter_s: Mapping[bool, float],
    max_tokens: int,
) -> DraftLimits:
    """The cap (0 to ``max_tokens``) and probability cut (the keys of ``outcomes_by_cut``:
    how the drafts would have fared under each) that ``model`` estimates fastest for steps
    of ``batch_size`` requests; ``drafter_s[drafting]`` is the drafter's time per request
    and step. Ties go to the shorter cap, then the lower cut."""
    best: DraftLimits | None = None
    for min_prob in sorted(outcomes_by_cut):
        outcomes = outcomes_by_cut[min_prob]
        for k in range(max_tokens + 1):
            drafting = k > 0
            speed = model.batch_tokens_per_second(
                batch_size,
                context_tokens,
                emitted=outcomes.emitted(k) if drafting else 1.0,
                verified=outcomes.verified(k) if drafting else 1.0,
                drafter_s=drafter_s[drafting],
            )
            if best is None or speed > best.tokens_per_s:
                best = DraftLimits(k, min_prob if drafting else 0.0, speed)
    assert best is not None, "outcomes_by_cut is empty"
    return best


class SpeedBudget:
    """The batch budget of :mod:`agentspec.draft_budget.batch_budget`'s interface (``max_tokens``,
    ``tokens_for``, ``min_prob_for``), choosing limits with ``model`` (see the module
    docstring)."""

    calibrated_cut: ClassVar[bool] = False

    def __init__(
        self,
        model: SpeedModel,
        max_tokens: int,
        *,
        warmup: int = 256,
        explore_every: int = 16,
        refit_every: int = 64,
        window: int = 100_000,
        cut_probs: Sequence[float] = CUT_PROBS,
    ) -> None:
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if window < 2 * warmup:
            raise ValueError("window must be at least twice warmup (halving must not end the estimate)")
        if 0.0 not in cut_probs or not all(0.0 <= p < 1.0 for p in cut_probs):
            raise ValueError("cut_probs must hold 0.0 (no cut) and values in [0, 1)")
        self.model = model
        self.max_tokens = max_tokens
        self.warmup = warmup
        self.explore_every = explore_every
        self.refit_every = refit_every
        self.window = window
        #: ``(drafted, accepted)`` counts of full-length drafts under each probability cut.
        self.outcomes_by_cut: dict[float, Counter[tuple[int, int]]] = {p: Counter() for p in sorted(cut_probs)}
        self.context_tokens = 0.0
        #: Drafter seconds per request and step, drafting and not (index upkeep only).
        self.drafter_s = {True: 0.0, False: 0.0}
        self._steps = 0
        self._limits: dict[int, DraftLimits] = {}
        self._fitted_at = -1
        self._step_min_prob = 0.0

    @property
    def outcomes(self) -> Counter[tuple[int, int]]:
        """``(drafted, accepted)`` counts of full-length drafts, uncut."""
        return self.outcomes_by_cut[0.0]

    @property
    def proposals(self) -> int:
        return sum(self.outcomes.values())

    def tokens_for(self, batch_size: int) -> int:
        """The cap for a step of ``batch_size`` requests (and, for :meth:`min_prob_for`,
        that step's probability cut)."""
        self._steps += 1
        if self.proposals < self.warmup or self._steps % self.explore_every == 0:
            self._step_min_prob = 0.0
            return self.max_tokens  # a step that teaches
        if self._steps - self._fitted_at >= self.refit_every:
            self._limits.clear()
            self._fitted_at = self._steps
        limits = self._limits.get(batch_size)
        if limits is None:
            limits = self._limits[batch_size] = self.best_limits(batch_size)
        self._step_min_prob = limits.min_prob
        return limits.tokens

    def min_prob_for(self, batch_size: int) -> float:
        """The probability cut of the step :meth:`tokens_for` was last asked about."""
        return self._step_min_prob

    def best_limits(self, batch_size: int) -> DraftLimits:
        """The fastest cap and probability cut at ``batch_size`` by the model."""
        outcomes = {p: DraftOutcomes(counts=dict(c)) for p, c in self.outcomes_by_cut.items()}
        return fastest_limits(self.model, batch_size, self.context_tokens, outcomes, self.drafter_s, self.max_tokens)

    def best_cap(self, batch_size: int) -> int:
        """The cap of :meth:`best_limits`."""
        return self.best_limits(batch_size).tokens

    def observe_draft(self, cap: int, drafted: int, accepted: int, probs: Sequence[float] = ()) -> None:
        """A draft's fate, with its path probabilities; only uncut full-length drafts count
        (see the module docstring). Without ``probs`` no cut is credited with shortening it."""
        if cap < self.max_tokens:
            return
        known = len(probs) >= drafted
        for min_prob, counts in self.outcomes_by_cut.items():
            kept = cut_length(probs[:drafted], min_prob) if min_prob and known else drafted
            counts[(kept, min(accepted, kept))] += 1
        if self.proposals > self.window:
            for min_prob, counts in self.outcomes_by_cut.items():
                # Unary plus drops the counts that halving took to zero.
                self.outcomes_by_cut[min_prob] = +Counter({key: n // 2 for key, n in counts.items()})

    def observe_step(self, batch_size: int, context_tokens: float, drafter_s: float, drafting: bool) -> None:
        """One step: its requests' mean context and the drafter's time per request."""
        if batch_size <= 0:
            return
        if self.context_tokens == 0.0:
            self.context_tokens = context_tokens
        self.context_tokens += _SMOOTHING * (context_tokens - self.context_tokens)
        previous = self.drafter_s[drafting]
        self.drafter_s[drafting] = drafter_s if previous == 0.0 else previous + _SMOOTHING * (drafter_s - previous)

    def observe_timed_step(self, batch_size: int, verified: int, emitted: int, seconds: float | None) -> None:
        """The speed model prices steps by its roofline, not by their times."""

    def observe_drafter(self, passes: int, seconds: float) -> None:
        """The drafter's time reaches the speed model through :meth:`observe_step`."""
