"""One sample's turns, assembled without I/O: both clients drive it the same way."""

from __future__ import annotations

from collections.abc import Sequence

from agentspec.client import TokenCompletion
from agentspec_rl.types import EnvStep, Sample, SampleState

__all__ = ["SampleBuilder"]


class SampleBuilder:
    """Accumulates a sample: model turns (mask 1) and observations (mask 0), exactly as
    the token ids came back, never re-tokenized."""

    def __init__(self, group_id: str, index: int, session_id: str, prompt: Sequence[int], version: int | None) -> None:
        self.group_id = group_id
        self.index = index
        self.session_id = session_id
        self.prompt = tuple(prompt)
        self.version = version
        self.response: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float | None] = []
        self.finish_reasons: list[str | None] = []
        self.backend = ""
        self.done = False

    def next_prompt(self) -> tuple[int, ...]:
        """The next model turn's prompt: the prompt and everything after it so far."""
        return self.prompt + tuple(self.response)

    def add_model_turn(self, completion: TokenCompletion) -> SampleState:
        ids = completion.token_ids
        self.response.extend(ids)
        self.mask.extend([1] * len(ids))
        lps = completion.logprobs or ()
        self.logprobs.extend(lps[i] if i < len(lps) else None for i in range(len(ids)))
        self.finish_reasons.append(completion.finish_reason)
        self.backend = completion.backend
        return SampleState(
            self.group_id,
            self.index,
            len(self.finish_reasons),
            self.prompt,
            tuple(self.response),
            ids,
            completion.finish_reason,
        )

    def add_env_step(self, step: EnvStep | None) -> None:
        """Append an observation; ``None`` or ``done`` finishes the sample."""
        if step is None:
            self.done = True
            return
        ids = [int(t) for t in step.observation_token_ids]
        if any(t < 0 for t in ids):
            raise ValueError(f"sample {self.index}: observation token ids must be non-negative")
        self.response.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([None] * len(ids))
        self.done = step.done

    def build(self) -> Sample:
        return Sample(
            group_id=self.group_id,
            index=self.index,
            session_id=self.session_id,
            prompt_token_ids=self.prompt,
            response_token_ids=tuple(self.response),
            response_mask=tuple(self.mask),
            logprobs=tuple(self.logprobs),
            finish_reasons=tuple(self.finish_reasons),
            policy_version=self.version,
            backend=self.backend,
        )
