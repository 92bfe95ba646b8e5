"""The proposer plug-in interface of the replay benchmark.

A proposer is driven call by call, the way a speculative-decoding engine drives
its drafter: ``begin_call`` with the prompt, then for every decoding step
``observe`` the tokens the step emitted and ``propose`` a draft for the next step,
``verified`` with the outcome, and finally ``end_call``. One proposer instance is
one server (replica): state it keeps across calls is what that server would keep.

A :data:`ProposerFactory` builds one proposer from :class:`ProposerSettings`; see
:mod:`agentspec.replay.registry` for how a replay finds factories by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from agentspec.driver import TokenSeed
from agentspec.replay.calls import CallSpec
from agentspec.replay.settings import (
    ProposerSettings,  # re-exported; defined apart, without numpy
)


@dataclass(slots=True)
class ReplayDraft:
    """Draft tokens for the next step, as the replay verifies them.

    (Not the index's :class:`agentspec.index.Draft`, which also carries the tokens'
    probabilities, a score and the level it came from.)

    A linear draft has ``parents=None``. A tree draft (used by the oracle) gives
    each node's parent index (``-1`` for a child of the current position); the
    verifier accepts the longest root path that equals the true continuation.
    """

    token_ids: Sequence[int] = ()
    parents: Sequence[int] | None = None
    #: The tokens' path probabilities, where the drafter estimates them (agentspec's index):
    #: the replay then also counts what each batch-budget probability cut would keep.
    probs: Sequence[float] = ()


EMPTY_DRAFT = ReplayDraft()


@runtime_checkable
class Proposer(Protocol):
    """A drafter as one server runs it. Methods are called by a single thread."""

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        """A new request arrives (``prompt``: 1-D contiguous int32) with its ``seeds``
        (vLLM's own methods take none and ignore them)."""
        ...

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        """The tokens a step emitted (accepted draft tokens + the bonus token)."""
        ...

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        """Draft the next tokens; ``context`` is prompt + output so far (int32 view)."""
        ...

    def verified(self, call_id: str, drafted: int, accepted: int) -> None:
        """Outcome of verifying the last draft (for drafters that adapt)."""
        ...

    def end_call(self, call_id: str) -> None:
        """The request finished; release per-request state."""
        ...

    def memory_bytes(self) -> int:
        """Current index memory in bytes (an estimate; 0 if it keeps none)."""
        ...

    def held_tokens(self) -> int:
        """Tokens its index holds now (0 if it keeps none or cannot tell)."""
        ...


@runtime_checkable
class SharesOutputs(Protocol):
    """A proposer whose replicas can exchange finished outputs (``ReplayConfig.exchange``)."""

    def start_sharing(self) -> None:
        """Keep the outputs of calls finished from now on for :meth:`take_shared_outputs`."""
        ...

    def take_shared_outputs(self) -> list[np.ndarray]:
        """Outputs of calls finished since the last take that peers may index."""
        ...

    def add_peer_outputs(self, outputs: Sequence[np.ndarray]) -> None:
        """Index outputs another replica published."""
        ...


@runtime_checkable
class BatchAware(Protocol):
    """A proposer whose drafts depend on how many requests share its step, as agentspec's
    batch budget makes them (told under ``ReplayConfig.lockstep``, where steps are shared)."""

    def set_batch_size(self, requests: int) -> None:
        """``requests`` calls are in flight on this server in the coming step."""
        ...


@runtime_checkable
class DraftsWholeCalls(Protocol):
    """A proposer that computes a call's drafts for all its steps at once, from the recorded
    output (a model drafter: one forward pass per call, not one per step). A step's draft
    may differ from drafting at that step only past its first token that differs from the
    recorded output, which verification never reads. The replay hands it the output after
    ``begin_call``; the time it takes counts as proposing time."""

    def take_output(self, call_id: str, output: np.ndarray) -> None:
        """The call's recorded output (1-D int32)."""
        ...


@runtime_checkable
class CountsSteps(Protocol):
    """A proposer with counters of its own, reported beside the replay's (the hybrid's
    choices between its drafters)."""

    def counters(self) -> Mapping[str, int]:
        """Counts since the proposer was made."""
        ...


ProposerFactory = Callable[[ProposerSettings], Proposer]
