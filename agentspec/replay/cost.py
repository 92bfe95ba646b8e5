"""The cost model that turns replay counts into an estimated speedup.

A decoding step of the target model costs ``step_ms`` plus ``draft_token_ms`` per
draft token it verifies (verification is batched into the same forward pass, so
each extra token costs a small fraction of a step while decoding is memory
bound). The drafter's own time is paid on the critical path: ``propose`` every
step, the index upkeep (start, extend, finish) every call, both as measured by
the replay. Without speculation every token is one step::

    time_spec  = steps * step_ms + drafted_tokens * draft_token_ms
                 + propose_time + index_time
    time_plain = output_tokens * step_ms
    speedup    = time_plain / time_spec

Prefill is the same with and without speculation and is left out.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from agentspec.draft_budget.step_cost import StepCostProfile


class CostModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def from_profile(cls, profile: StepCostProfile, batch: int = 1) -> CostModel:
        """The cost of one request's steps on the server that measured ``profile``
        (``agentspec serve --agentspec-cost-profile``), in steps of ``batch`` requests:
        its share of a step (the fixed cost divided among the batch) verifying its last
        token, plus each draft token's verification."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        step_s = profile.fixed_s / batch + profile.per_request_s + profile.per_token_s
        if step_s <= 0:
            raise ValueError("the cost profile gives a step of one request no time")
        return cls(step_ms=step_s * 1e3, draft_token_ms=profile.per_token_s * 1e3, source="profile", batch=batch)

    #: One decoding step of the target model (batch of one request's view).
    step_ms: float = Field(default=25.0, gt=0)
    #: Extra verification cost per draft token in a step.
    draft_token_ms: float = Field(default=0.25, ge=0)
    #: Where the figures come from: assumed (the options' values) or a server's profile.
    source: Literal["assumed", "profile"] = "assumed"
    #: Requests sharing each step (the lockstep concurrency a profile was divided among).
    batch: int = Field(default=1, ge=1)

    def spec_seconds(self, steps: int, drafted_tokens: int, propose_ns: int, index_ns: int) -> float:
        """The time of the replayed calls' decoding steps with speculation, in seconds."""
        return (steps * self.step_ms + drafted_tokens * self.draft_token_ms) / 1e3 + (propose_ns + index_ns) / 1e9

    def tokens_per_second(
        self, output_tokens: int, steps: int, drafted_tokens: int, propose_ns: int, index_ns: int
    ) -> float:
        """Output tokens per second of a server decoding ``batch`` such requests at once."""
        seconds = self.spec_seconds(steps, drafted_tokens, propose_ns, index_ns)
        return self.batch * output_tokens / seconds if seconds > 0 else 0.0

    def speedup(
        self,
        output_tokens: int,
        steps: int,
        drafted_tokens: int,
        propose_ns: int,
        index_ns: int,
    ) -> float:
        plain_ms = output_tokens * self.step_ms
        spec_ms = steps * self.step_ms + drafted_tokens * self.draft_token_ms + (propose_ns + index_ns) / 1e6
        return plain_ms / spec_ms if spec_ms > 0 else 1.0
