"""What a rollout returns: samples of token ids with their masks, log-probabilities, stop
reasons and the policy version that produced them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["EnvStep", "Group", "RolloutError", "Sample", "SampleState"]


class RolloutError(RuntimeError):
    """A group could not be rolled out (one of its samples failed); names the group and why."""

    def __init__(self, group_id: str, message: str) -> None:
        super().__init__(f"group {group_id!r}: {message}")
        self.group_id = group_id
        self.reason = message


@dataclass(frozen=True, slots=True)
class Sample:
    """One trajectory of a group: the prompt, then everything after it, token for token.

    ``response_token_ids`` holds the model's turns and the environment's observations in
    order; ``response_mask`` is 1 where the model generated the token (train on it) and 0
    where the environment supplied it. ``logprobs`` is the sampled token's log-probability
    under the policy that generated it (None for environment tokens, or when not asked for).
    """

    group_id: str
    index: int
    session_id: str
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    logprobs: tuple[float | None, ...]
    finish_reasons: tuple[str | None, ...]
    """Why each model turn ended: ``stop`` (EOS or a stop token), ``length`` (max_tokens)."""
    policy_version: int | None
    """The policy version live when the sample was dispatched (``on_weight_update``)."""
    backend: str
    """The server that generated it."""

    @property
    def finish_reason(self) -> str | None:
        """Why the last model turn ended."""
        return self.finish_reasons[-1] if self.finish_reasons else None

    @property
    def turns(self) -> int:
        return len(self.finish_reasons)


@dataclass(frozen=True, slots=True)
class Group:
    """``n`` samples of one prompt (a GRPO group), all pinned to one server."""

    group_id: str
    prompt_token_ids: tuple[int, ...]
    samples: tuple[Sample, ...]


@dataclass(frozen=True, slots=True)
class SampleState:
    """What an environment sees after a model turn."""

    group_id: str
    index: int
    turn: int
    """Model turns so far (1 after the first)."""
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    last_output_token_ids: tuple[int, ...]
    last_finish_reason: str | None


@dataclass(frozen=True, slots=True)
class EnvStep:
    """The environment's answer to a model turn: observation tokens to append (a tool
    result, a user reply), and whether the sample is finished."""

    observation_token_ids: Sequence[int] = ()
    done: bool = False
