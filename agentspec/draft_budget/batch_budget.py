"""How many draft tokens a request may get, given how many requests share the step.

Speculation trades compute for latency: each draft token is verified by the target model
in the same forward pass. At small batches the GPU is memory-bound and verification is
nearly free; as the batch grows the step becomes compute-bound and rejected draft tokens
start to cost real time. So the budget shrinks with the batch and switches off entirely:

    budget(b) = k                                   for b <= B_full
              = max(1, k // 2 ** ceil(log2(b / B_full)))   for B_full < b <= B_off
              = 0                                   for b > B_off

where ``k`` is ``num_speculative_tokens`` and ``b`` the number of requests in the step:
full drafts up to ``B_full`` (default 8), halving per doubling of the batch, none above
``B_off`` (default 64). With ``B_off`` at 64, a k=32 budget is 16 at 9–16 requests, 8 at
17–32 and 4 at 33–64. The rule is deliberately simple and monotone; a profile-driven
rule (measured step time vs. tokens) can replace :meth:`BatchBudget.tokens_for` without
touching the driver (:mod:`agentspec.driver`) that applies it: any :class:`DraftBudget`
does, such as :class:`agentspec.draft_budget.speed_budget.SpeedBudget`, which chooses caps with a speed
model of the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol


class DraftBudget(Protocol):
    """Draft tokens per request by batch size, told how drafts and steps went."""

    #: Whether the step's probability cut (:meth:`min_prob_for`) is compared with a draft's
    #: calibrated path probability (the index's level calibration) or its raw one.
    calibrated_cut: ClassVar[bool]

    @property
    def max_tokens(self) -> int: ...

    def tokens_for(self, batch_size: int) -> int: ...

    def min_prob_for(self, batch_size: int) -> float:
        """The path probability below which drafts stop in the step :meth:`tokens_for` was
        last asked about (0.0: none beyond the draft policy's own)."""

    def observe_draft(self, cap: int, drafted: int, accepted: int, probs: Sequence[float] = ()) -> None:
        """A draft asked with ``cap`` tokens proposed ``drafted`` (with path probabilities
        ``probs``) and kept ``accepted``."""

    def observe_step(self, batch_size: int, context_tokens: float, drafter_s: float, drafting: bool) -> None:
        """A step of ``batch_size`` requests at a mean ``context_tokens``, whose drafter
        took ``drafter_s`` per request."""

    def observe_timed_step(self, batch_size: int, verified: int, emitted: int, seconds: float | None) -> None:
        """A decoding step of ``batch_size`` requests verified ``verified`` tokens and
        emitted ``emitted`` in ``seconds`` (None: not timed by a clock that may steer)."""

    def observe_drafter(self, passes: int, seconds: float) -> None:
        """A model drafter's call took ``seconds`` running ``passes`` passes beyond its first."""


@dataclass(frozen=True, slots=True)
class BatchBudget:
    """The draft-length rule above. ``max_tokens`` is ``k``."""

    max_tokens: int
    full_batch: int = 8
    off_batch: int = 64

    calibrated_cut: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        if not 1 <= self.full_batch <= self.off_batch:
            raise ValueError("need 1 <= full_batch <= off_batch")

    def tokens_for(self, batch_size: int) -> int:
        """Draft tokens allowed per request when ``batch_size`` requests run in one step."""
        if batch_size <= self.full_batch:
            return self.max_tokens
        if batch_size > self.off_batch:
            return 0
        # Smallest h with full_batch * 2**h >= batch_size, in integers (no float log).
        halvings = 0
        while self.full_batch << halvings < batch_size:
            halvings += 1
        return max(1, self.max_tokens >> halvings) if self.max_tokens else 0

    def min_prob_for(self, batch_size: int) -> float:
        """The fixed rule cuts no draft short: 0.0."""
        return 0.0

    def observe_draft(self, cap: int, drafted: int, accepted: int, probs: Sequence[float] = ()) -> None:
        """The fixed rule learns nothing."""

    def observe_step(self, batch_size: int, context_tokens: float, drafter_s: float, drafting: bool) -> None:
        """The fixed rule learns nothing."""

    def observe_timed_step(self, batch_size: int, verified: int, emitted: int, seconds: float | None) -> None:
        """The fixed rule learns nothing."""

    def observe_drafter(self, passes: int, seconds: float) -> None:
        """The fixed rule learns nothing."""
