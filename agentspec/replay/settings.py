"""Settings of the built-in replay proposers (:class:`ProposerSettings`).

Apart from :mod:`agentspec.replay.proposer` (which re-exports it) so that the benchmark's
settings and command line import without numpy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentspec.draft_budget.step_cost import StepCostProfile
from agentspec.index.policy import DraftPolicy


class DrafterReplaySettings(BaseModel):
    """A trained drafter in the replay (``agentspec bench --drafter HEAD --target MODEL``):
    the ``drafter``, ``agentspec-hybrid`` and ``agentspec-hybrid-arctic`` proposers draft
    with it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The EAGLE-3 head's folder (``agentspec train-drafter``'s output).
    head: Path
    #: The target model's folder (Hugging Face layout): the head reads its hidden states.
    target: Path
    #: Tokens the drafter drafts per step (vLLM's ``num_speculative_tokens`` for it).
    tokens: int = Field(default=3, ge=1, le=16)
    #: Where the target and head run (a torch device).
    device: str = "cpu"


class ProposerSettings(BaseModel):
    """Knobs the built-in proposers read (vLLM's defaults where vLLM has one).

    vLLM has no default ``num_speculative_tokens`` for ngram (and falls back to
    n = 5..5 when neither lookup bound is given); k = 8, n = 2..5 is the common
    configuration and the one the project's measurements use.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # vLLM ngram: num_speculative_tokens, prompt_lookup_min / prompt_lookup_max.
    ngram_k: int = 8
    ngram_min: int = 2
    ngram_max: int = 5
    #: "auto" (vLLM's own function when vLLM is importable), "vllm" or "numpy".
    ngram_impl: Literal["auto", "vllm", "numpy"] = "auto"
    # vLLM suffix: SpeculativeConfig.suffix_decoding_* defaults. suffix_depth and
    # suffix_cached_requests (0: no cross-request memory) serve both releases; suffix_tokens,
    # suffix_factor and suffix_min_prob are 0.32's tree (``vllm-suffix-0.32``).
    suffix_depth: int = 24
    suffix_tokens: int = 24
    suffix_factor: float = 1.0
    suffix_min_prob: float = 0.1
    suffix_cached_requests: int = 10000
    #: 0.34's ``vllm-suffix``: num_speculative_tokens, every one verified (None: vLLM's
    #: default, min(8, suffix_depth)).
    suffix_fixed_tokens: int | None = Field(default=None, ge=1)
    #: 0.34's ``vllm-suffix``: suffix_decoding_corpus_tokens, the ring of finished responses.
    suffix_corpus_tokens: int = Field(default=1 << 20, ge=0, lt=1 << 31)
    #: agentspec: the step cost of the server replayed (``agentspec serve
    #: --agentspec-cost-profile``); its drafts are then cut where the server's cost budget
    #: cuts them at that cost (None: uncut, as a server that has timed nothing).
    cost_profile: StepCostProfile | None = None
    # Oracle: tree speculation over a global index of everything seen.
    oracle_depth: int = 64
    oracle_nodes: int = 256
    #: agentspec's draft policy (None = the index's defaults).
    agentspec_policy: DraftPolicy | None = None
    #: The trained drafter of the ``drafter`` and ``agentspec-hybrid[-arctic]`` proposers.
    drafter: DrafterReplaySettings | None = None
    #: Free-form settings for proposers registered by others.
    extra: dict[str, Any] = Field(default_factory=dict)
