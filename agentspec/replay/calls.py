"""What the replay loop consumes: calls with their identity, prompt and output tokens."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from agentspec.driver import TokenSeed


@dataclass(frozen=True, slots=True)
class CallSpec:
    """Identity of one recorded LLM call, as a server would know it."""

    call_id: str
    session_id: str
    group_id: str
    trajectory_id: str
    turn: int
    source: str


class ReplayCall(Protocol):
    """A call whose token arrays are materialised on demand (prompts can be large)."""

    @property
    def spec(self) -> CallSpec: ...

    def prompt(self) -> np.ndarray:
        """Prompt token ids, 1-D contiguous int32."""
        ...

    def output(self) -> np.ndarray:
        """Recorded output token ids (what greedy decoding produces), 1-D int32."""
        ...

    def seeds(self) -> tuple[TokenSeed, ...]:
        """Seeds the call's request carries (condenser seeding: what its window dropped)."""
        ...


@dataclass(frozen=True, slots=True)
class StaticCall:
    """A pre-tokenized call (tests, synthetic workloads, other front ends)."""

    spec: CallSpec
    prompt_ids: np.ndarray
    output_ids: np.ndarray

    def prompt(self) -> np.ndarray:
        return self.prompt_ids

    def output(self) -> np.ndarray:
        return self.output_ids

    def seeds(self) -> tuple[TokenSeed, ...]:
        return ()


def static_call(spec: CallSpec, prompt: Sequence[int] | np.ndarray, output: Sequence[int] | np.ndarray) -> StaticCall:
    return StaticCall(
        spec,
        np.ascontiguousarray(prompt, dtype=np.int32),
        np.ascontiguousarray(output, dtype=np.int32),
    )


#: One source's workload: its trajectories, each an ordered list of calls.
SourceWorkload = list[list[ReplayCall]]
