"""Settings of the engine adapter, shared by every process of one vLLM server.

vLLM runs the HTTP server, the engine core and the model workers in separate processes
that inherit the environment, so one environment variable carries the settings to all of
them: :data:`ENV_CONFIG` holds a JSON object of :class:`EngineSettings` fields (``{}`` for
the defaults). **Its presence is what turns agentspec on**: with it unset, the installed
plugin changes nothing and ``--speculative-config '{"method": "suffix"}'`` is vLLM's own
suffix decoding.
"""

from __future__ import annotations

import json
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentspec import wire
from agentspec.engine.exchange_config import RedisExchangeConfig
from agentspec.index.policy import IndexConfig
from agentspec.draft_budget.speed_model import parse_speed_model

#: JSON object of :class:`EngineSettings`; set → the plugin substitutes the proposer.
ENV_CONFIG = "AGENTSPEC_ENGINE_CONFIG"


class DrafterSettings(BaseModel):
    """A model drafter beside the draft index (hybrid drafting, see docs/engine.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(
        ...,
        min_length=1,
        description="The draft model: a folder or Hugging Face id of a small model with the target's vocabulary.",
    )
    num_tokens: int = Field(
        4, ge=1, description="Tokens the model drafter drafts per step (its autoregressive passes)."
    )
    method: Literal["draft_model", "eagle", "eagle3"] = Field(
        "draft_model",
        description="vLLM's speculative method for the drafter: a small model (draft_model) or an EAGLE head.",
    )


class EngineSettings(BaseModel):
    """What ``agentspec serve`` decides for the server's processes.

    The draft policy's ``max_depth``, ``max_spec_tokens``, ``max_spec_factor`` and
    ``min_token_prob`` come from vLLM's ``--speculative-config`` (``num_speculative_tokens``,
    ``suffix_decoding_*``), so the two never disagree; ``index`` holds the rest.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    state_dir: str | None = Field(
        None,
        description=(
            "Folder where the proposer publishes its statistics for the API server"
            " (per-session stats, /metrics). None: statistics are not published."
        ),
    )
    index: IndexConfig = Field(default_factory=IndexConfig)

    # Batch-aware budget, see agentspec.engine.budget.
    full_draft_batch: int = Field(8, ge=1, description="Full-length drafts up to this many running requests.")
    no_draft_batch: int = Field(
        64, ge=1, description="No drafts above this many running requests (halving in between)."
    )

    speed_model: str | None = Field(
        None,
        description=(
            "GPU:MODEL (e.g. h100:8b; see agentspec.draft_budget.speed_model): choose each step's draft cap with"
            " this speed model from the engine's own drafts (agentspec.draft_budget.speed_budget) instead"
            " of the fixed batch rule. None: the fixed rule."
        ),
    )

    # Seeds on the wire, see docs/wire.md.
    max_seeds_per_request: int = Field(wire.MAX_SEEDS_PER_REQUEST, ge=0)
    max_seed_tokens_per_request: int = Field(wire.MAX_SEED_TOKENS_PER_REQUEST, ge=0)

    share_across_tenants: bool = Field(
        False,
        description=(
            "Let every tenant draft from every other tenant's text (one draft index for all"
            " API keys and cache_salt values). Off: a request drafts only from its own"
            " tenant's text. See docs/security.md for what sharing reveals."
        ),
    )

    admission_token: str | None = Field(
        None,
        description=(
            "A secret shared by the server's processes: the middleware stamps it on every"
            " request it admitted, and the engine runs agentspec (sessions, tenants, seeds,"
            " drafts) only for stamped requests, so a route the middleware does not see"
            " cannot name another tenant or carry seeds. build_env draws one; None (an"
            " in-process engine, whose caller is the operator): every request is trusted."
        ),
    )

    publish_interval_s: float = Field(0.2, gt=0, description="Least time between two statistics snapshots while busy.")
    step_log_dir: str | None = Field(
        None,
        description=(
            "Folder where each drafting worker appends a log of every drafting step (batch size,"
            " per request the tokens emitted, draft cap and draft length; no token ids), for"
            " agentspec.replay.step_replay. None: off."
        ),
    )

    # Corpus exchange between replicas, see agentspec.engine.exchange.
    exchange_dir: str | None = Field(
        None,
        description=(
            "Folder shared by the replicas of one model: each publishes its finished outputs"
            " there and indexes the others' into its global corpus. None: off."
        ),
    )
    exchange_url: str | None = Field(
        None,
        description=(
            "redis://host:port/db[?stream=NAME&max_entries=N&max_age_s=S]: the replicas of one"
            " model exchange their finished outputs through a Redis stream (see"
            " agentspec.engine.exchange.redis_streams). None: off. Not with exchange_dir."
        ),
    )
    replica_id: str | None = Field(
        None,
        min_length=1,
        description=(
            "This server's name among the replicas, the same after a restart (agentspec serve"
            " uses host:port unless told). Each drafting worker appends its data-parallel rank."
            " None: host and process id (not stable)."
        ),
    )
    exchange_interval_s: float = Field(0.5, gt=0, description="Least time between two polls of the exchange.")
    exchange_step_budget_s: float = Field(
        0.01,
        gt=0,
        description=(
            "Most time one engine step spends indexing peers' outputs (at least one is"
            " indexed); the rest waits for the next steps, so a catch-up never stalls a batch."
        ),
    )

    drafter: DrafterSettings | None = Field(
        None,
        description=(
            "A model drafter for the steps the index has no confident draft for (vLLM's"
            " draft_model method, with the index beside it). None: the index alone."
        ),
    )

    @model_validator(mode="after")
    def _batches_ordered(self) -> EngineSettings:
        if self.no_draft_batch < self.full_draft_batch:
            raise ValueError("no_draft_batch must be >= full_draft_batch")
        if self.speed_model is not None:
            parse_speed_model(self.speed_model)  # a clear error now, not in the engine
        if self.step_log_dir is not None and self.drafter is not None:
            raise ValueError("the step log covers the index's drafts alone: not with a model drafter")
        if self.exchange_url is not None:
            if self.exchange_dir is not None:
                raise ValueError("choose one exchange: a folder (exchange_dir) or Redis (exchange_url), not both")
            RedisExchangeConfig.parse(self.exchange_url)
        return self

    def to_env(self) -> str:
        """The value of :data:`ENV_CONFIG` that carries these settings."""
        return self.model_dump_json(exclude_defaults=True)


def enabled() -> bool:
    """Whether this process tree runs agentspec (the env var is set)."""
    return ENV_CONFIG in os.environ


def load_settings() -> EngineSettings:
    """Settings from the environment; defaults when unset. Raises ``ValueError`` on bad JSON."""
    raw = os.environ.get(ENV_CONFIG, "").strip() or "{}"
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV_CONFIG} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{ENV_CONFIG} must hold a JSON object, got {type(data).__name__}")  # noqa: TRY004
    return EngineSettings.model_validate(data)
