"""Draft caps chosen by the speed model, from the engine's own drafts.

``agentspec serve --agentspec-speed-model GPU:MODEL`` replaces the fixed batch rule
(:class:`agentspec.budget.BatchBudget`) with :class:`ModelBudget`. At each batch size it
caps drafts at the length that :mod:`agentspec.speed` estimates fastest. The estimate uses
three things this engine measured:

- how its drafts fared: ``(drafted, accepted)`` per request and step;
- the mean context of its running requests;
- the drafter's own time per request and step.

A draft cut to ``k`` tokens and wholly accepted might have gone on, so it says nothing
about longer caps. Only full-length steps teach: every step during the warm-up, then one
step in ``explore_every``. Counts are halved when they pass ``window`` proposals, so the
estimate follows the traffic.
"""

from __future__ import annotations

from collections import Counter

from agentspec.speed import DraftOutcomes, SpeedModel

__all__ = ["ModelBudget"]

#: Weight of the newest step in the running means of context and drafter time.
_SMOOTHING = 0.05


class ModelBudget:
    """The batch budget of :mod:`agentspec.budget`'s interface (``max_tokens``,
    ``tokens_for``), choosing caps with ``model`` (see the module docstring)."""

    def __init__(
        self,
        model: SpeedModel,
        max_tokens: int,
        *,
        warmup: int = 256,
        explore_every: int = 16,
        refit_every: int = 64,
        window: int = 100_000,
    ) -> None:
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if window < 2 * warmup:
            raise ValueError("window must be at least twice warmup (halving must not end the estimate)")
        self.model = model
        self.max_tokens = max_tokens
        self.warmup = warmup
        self.explore_every = explore_every
        self.refit_every = refit_every
        self.window = window
        self.outcomes: Counter[tuple[int, int]] = Counter()
        self.context_tokens = 0.0
        #: Drafter seconds per request and step, drafting and not (index upkeep only).
        self.drafter_s = {True: 0.0, False: 0.0}
        self._steps = 0
        self._caps: dict[int, int] = {}
        self._fitted_at = -1

    @property
    def proposals(self) -> int:
        return sum(self.outcomes.values())

    def tokens_for(self, batch_size: int) -> int:
        """The cap for a step of ``batch_size`` requests."""
        self._steps += 1
        if self.proposals < self.warmup or self._steps % self.explore_every == 0:
            return self.max_tokens  # a step that teaches
        if self._steps - self._fitted_at >= self.refit_every:
            self._caps.clear()
            self._fitted_at = self._steps
        cap = self._caps.get(batch_size)
        if cap is None:
            cap = self._caps[batch_size] = self.best_cap(batch_size)
        return cap

    def best_cap(self, batch_size: int) -> int:
        """The fastest cap at ``batch_size`` by the model, from 0 to ``max_tokens``."""
        outcomes = DraftOutcomes(counts=dict(self.outcomes))

        def speed(k: int) -> float:
            drafting = k > 0
            return self.model.batch_tokens_per_second(
                batch_size,
                self.context_tokens,
                emitted=outcomes.emitted(k) if drafting else 1.0,
                verified=outcomes.verified(k) if drafting else 1.0,
                drafter_s=self.drafter_s[drafting],
            )

        return max(range(self.max_tokens + 1), key=speed)

    def observe_draft(self, cap: int, drafted: int, accepted: int) -> None:
        """A draft's fate; only full-length caps count (see the module docstring)."""
        if cap < self.max_tokens:
            return
        self.outcomes[(drafted, accepted)] += 1
        if self.proposals > self.window:
            for key in list(self.outcomes):
                self.outcomes[key] //= 2
            self.outcomes += Counter()  # drop the zeros

    def observe_step(self, batch_size: int, context_tokens: float, drafter_s: float, drafting: bool) -> None:
        """One step: its requests' mean context and the drafter's time per request."""
        if batch_size <= 0:
            return
        if self.context_tokens == 0.0:
            self.context_tokens = context_tokens
        self.context_tokens += _SMOOTHING * (context_tokens - self.context_tokens)
        previous = self.drafter_s[drafting]
        self.drafter_s[drafting] = drafter_s if previous == 0.0 else previous + _SMOOTHING * (drafter_s - previous)
