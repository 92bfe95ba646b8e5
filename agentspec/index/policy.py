"""Configuration of the draft index: how drafts are taken and how much memory it may hold.

The defaults were chosen by replaying the development set of recorded agent trajectories
(see ``docs/policy.md`` for the measurements). vLLM's own suffix defaults are available
as :meth:`DraftPolicy.vllm_defaults` for comparisons.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DraftPolicy(BaseModel):
    """The knobs of suffix-tree drafting, with the meaning vLLM gives them.

    A draft continues the longest suffix of the call's context found in an index. Its
    length is capped by ``max_spec_tokens`` and by ``max_spec_factor * match_len +
    max_spec_offset`` (short matches are weak evidence, so they get short drafts); a
    token whose estimated probability falls below ``min_token_prob`` ends the draft.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_depth: int = Field(64, ge=1, le=1024, description="Suffix tree depth: longest match plus draft.")
    max_spec_tokens: int = Field(32, ge=0, le=1024, description="Most tokens in one draft.")
    max_match_tokens: int = Field(
        32,
        ge=1,
        le=1024,
        description=(
            "Context tokens matched against the trees. Matching costs grow with the square of"
            " this; beyond ~32 tokens a longer match rarely changes the draft."
        ),
    )
    max_spec_factor: float = Field(2.0, ge=0.0, description="Draft length per matched token.")
    max_spec_offset: float = Field(0.0, description="Added to the factor-based length cap.")
    min_token_prob: float = Field(0.2, ge=0.0, le=1.0, description="Stop the draft below this.")
    calibrate_levels: bool = Field(
        True,
        description=(
            "Weigh each level's draft scores by how well that level's earlier drafts were borne"
            " out (accepted / expected tokens) when choosing between levels."
        ),
    )

    @classmethod
    def vllm_defaults(cls) -> DraftPolicy:
        """vLLM 0.32's suffix-decoding defaults (depth 24, 24 tokens, factor 1.0)."""
        return cls(max_depth=24, max_spec_tokens=24, max_spec_factor=1.0, min_token_prob=0.1, calibrate_levels=False)


class IndexConfig(BaseModel):
    """Draft policy plus the memory budget of every level of the index.

    Budgets are in tokens held by the suffix trees; memory grows linearly with them
    (a few hundred bytes per token at depth 64).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: DraftPolicy = Field(default_factory=DraftPolicy)

    global_max_tokens: int = Field(
        4_000_000, ge=0, description="Tokens of finished outputs kept in the global corpus; 0 disables it."
    )
    sessions_max_tokens: int = Field(16_000_000, ge=1, description="Tokens held by all sessions and groups together.")
    session_max_tokens: int = Field(
        1_000_000, ge=1, description="Tokens one session or group may hold; older text is dropped first."
    )
    max_sessions: int = Field(10_000, ge=1, description="Sessions and groups held at once (LRU).")
    session_idle_calls: int | None = Field(
        2048,
        ge=1,
        description=(
            "A session with no call in flight while this many calls started in the index drops"
            " its prompts and outputs (seeds and counters stay; its next prompt indexes its"
            " context again). None keeps them until the budgets evict them."
        ),
    )
    group_idle_calls: int | None = Field(
        2048,
        ge=1,
        description=(
            "A group with no call in flight while this many calls started in the index drops"
            " its calls' outputs where they went into the global corpus too (isolate_groups off,"
            " global_max_tokens > 0); its seeds and counters stay. None keeps them until the"
            " budgets evict them."
        ),
    )

    seed_max_tokens: int = Field(65_536, ge=1, description="Largest single seed.")
    seed_max_total_tokens: int = Field(262_144, ge=1, description="Seeded tokens one session or group may hold.")

    isolate_groups: bool = Field(
        False,
        description=(
            "Multi-tenant mode: calls that name a group never draft from the global corpus and"
            " their outputs never enter it, so no text crosses groups (drafts leak through timing)."
        ),
    )

    @model_validator(mode="after")
    def _budgets_are_consistent(self) -> IndexConfig:
        if self.session_max_tokens > self.sessions_max_tokens:
            raise ValueError("session_max_tokens must not exceed sessions_max_tokens")
        if self.seed_max_tokens > self.seed_max_total_tokens:
            raise ValueError("seed_max_tokens must not exceed seed_max_total_tokens")
        return self
