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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentspec import wire
from agentspec.draft_budget.speed_model import parse_speed_model
from agentspec.draft_budget.step_cost import read_cost_profile
from agentspec.engine.exchange_config import RedisExchangeConfig
from agentspec.index.policy import IndexConfig

#: JSON object of :class:`EngineSettings`; set → the plugin substitutes the proposer.
ENV_CONFIG = "AGENTSPEC_ENGINE_CONFIG"


def cli(
    name: str | None = None, *, metavar: str | None = None, json: bool = False, hidden: bool = False
) -> dict[str, Any]:
    """How a field appears among ``agentspec serve``'s options (its ``json_schema_extra``):
    ``--agentspec-NAME`` (default: the field's name with dashes), its metavar, whether its
    value is a JSON object (a nested model given whole), or ``hidden`` (no option: set by
    the launcher itself). Help, default and validation are the field's own."""
    return {"cli": {"name": name, "metavar": metavar, "json": json, "hidden": hidden}}


class DrafterSettings(BaseModel):
    """A model drafter beside the draft index (hybrid drafting, see docs/engine.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(
        ...,
        min_length=1,
        description=(
            "A draft model (folder or Hugging Face id, the target's vocabulary) that drafts the steps the"
            " index has no confident draft for: hybrid drafting (docs/engine.md)."
        ),
        json_schema_extra=cli("drafter", metavar="MODEL"),
    )
    num_tokens: int = Field(
        4,
        ge=1,
        description="Tokens the draft model drafts per step (its autoregressive passes).",
        json_schema_extra=cli("drafter-tokens"),
    )
    method: Literal["draft_model", "eagle", "eagle3"] = Field(
        "draft_model",
        description="vLLM's method for the drafter: draft_model (a small model) or eagle / eagle3 (an EAGLE head).",
        json_schema_extra=cli("drafter-method"),
    )
    rule: Literal["expected", "score"] = Field(
        "expected",
        description=(
            "How a request's step picks its drafter: expected (the index's draft when its calibrated expected"
            " accepted tokens reach the drafter's, measured online) or score (the index's draft when its score"
            " reaches the drafter's draft length, Arctic Inference's rule)."
        ),
        json_schema_extra=cli("drafter-rule"),
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
            "Folder where the workers publish their statistics for the API server (per-session"
            " stats, /metrics). agentspec serve makes a fresh temporary one unless given; unset"
            " elsewhere: statistics are not published."
        ),
    )
    index: IndexConfig = Field(
        default_factory=IndexConfig,
        description="JSON of agentspec.index.policy.IndexConfig: the index's memory budgets and eviction.",
        json_schema_extra=cli("index-config", metavar="JSON", json=True),
    )

    draft_budget: Literal["cost", "batch"] = Field(
        "cost",
        description=(
            "How each step's drafts are limited: cost (cut where a token's calibrated path probability"
            " no longer pays for its verification, by the step cost this engine measures on itself) or"
            " batch (full drafts up to full_draft_batch requests, halving up to no_draft_batch, none above)."
        ),
    )
    cost_profile: str | None = Field(
        None,
        description=(
            "A JSON file of the step cost (agentspec.draft_budget.step_cost): read at start as the cost"
            " budget's prior when it exists, rewritten with what the engine measures while it runs, for"
            " the next start and for agentspec bench --cost-profile. Unset: the engine starts knowing"
            " nothing of its cost (no draft cut until steps are timed) and keeps what it learns in"
            " its statistics only."
        ),
        json_schema_extra=cli(metavar="FILE"),
    )

    # Batch-aware budget, see agentspec.draft_budget.batch_budget.
    full_draft_batch: int = Field(8, ge=1, description="Full-length drafts up to this many running requests.")
    no_draft_batch: int = Field(
        64, ge=1, description="No drafts above this many running requests (halving in between)."
    )

    speed_model: str | None = Field(
        None,
        description=(
            "GPU:MODEL (GPU h100 or h200; MODEL 8b, 32b or 70b): choose each step's draft lengths with a"
            " speed model of this GPU and model size, from the engine's own acceptance, instead of the"
            " two batch thresholds (docs/speed.md)."
        ),
        json_schema_extra=cli(metavar="GPU:MODEL"),
    )

    # Seeds on the wire, see docs/wire.md.
    max_seeds_per_request: int = Field(
        wire.MAX_SEEDS_PER_REQUEST, ge=0, description="Seeds per request.", json_schema_extra=cli("max-seeds")
    )
    max_seed_tokens_per_request: int = Field(
        wire.MAX_SEED_TOKENS_PER_REQUEST,
        ge=0,
        description="Seed tokens per request, in all.",
        json_schema_extra=cli("max-seed-tokens"),
    )

    share_across_tenants: bool = Field(
        False,
        description=(
            "Let every tenant (API key, cache_salt) draft from every other tenant's text: one draft"
            " index for all. Reveals text across tenants through acceptance and timing: see"
            " docs/security.md."
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
        # Drawn for each launch, never typed: a secret on a command line ends up in logs.
        json_schema_extra=cli(hidden=True),
    )

    publish_interval_s: float = Field(
        0.2,
        gt=0,
        description="Least time between two statistics snapshots while busy, in seconds.",
        json_schema_extra=cli("publish-interval", metavar="SECONDS"),
    )
    step_log_dir: str | None = Field(
        None,
        description=(
            "Log every drafting step here (batch size, per request the tokens emitted, draft cap"
            " and draft length; no token ids), to replay the server's own steps offline and"
            " compare (agentspec.replay.step_replay, docs/bench.md). Off by default."
        ),
    )

    # Corpus exchange between replicas, see agentspec.engine.exchange.
    exchange_dir: str | None = Field(
        None,
        description=(
            "Folder shared with the other replicas of this model: each publishes its finished"
            " outputs there and indexes the others' into its global corpus (tensor/pipeline-"
            "parallel size 1 only). Off by default."
        ),
    )
    exchange_url: str | None = Field(
        None,
        description=(
            "redis://HOST:PORT/DB[?stream=NAME&max_entries=N&max_age_s=S]: exchange finished outputs"
            " with the other replicas of this model through a Redis stream, across machines"
            " (docs/fleet.md). Off by default; not with an exchange folder."
        ),
        json_schema_extra=cli("exchange", metavar="URL"),
    )
    replica_id: str | None = Field(
        None,
        min_length=1,
        description=(
            "This server's name among the exchanging replicas, kept across restarts (agentspec"
            " serve uses HOST:PORT unless told). Each drafting worker appends its data-parallel"
            " rank. Unset elsewhere: host and process id (not stable)."
        ),
    )
    exchange_interval_s: float = Field(
        0.5,
        gt=0,
        description="Least time between two polls of the exchange, in seconds.",
        json_schema_extra=cli("exchange-interval", metavar="SECONDS"),
    )
    exchange_step_budget_s: float = Field(
        0.01,
        gt=0,
        description=(
            "Most time one engine step spends indexing peers' outputs, in seconds (at least one"
            " is indexed); the rest waits for the next steps, so a catch-up never stalls a batch."
        ),
        json_schema_extra=cli("exchange-step-budget", metavar="SECONDS"),
    )

    drafter: DrafterSettings | None = Field(
        None,
        description=(
            "A model drafter for the steps the index has no confident draft for (vLLM's"
            " draft_model method, with the index beside it). None: the index alone."
        ),
    )

    @field_validator("speed_model")
    @classmethod
    def _known_speed_model(cls, value: str | None) -> str | None:
        if value is not None:
            parse_speed_model(value)  # a clear error now, not in the engine
        return value

    @field_validator("cost_profile")
    @classmethod
    def _readable_cost_profile(cls, value: str | None) -> str | None:
        if value is not None and os.path.exists(value):
            read_cost_profile(value)  # a clear error now, not in the engine
        return value

    @field_validator("exchange_url")
    @classmethod
    def _valid_exchange_url(cls, value: str | None) -> str | None:
        if value is not None:
            RedisExchangeConfig.parse(value)
        return value

    @model_validator(mode="after")
    def _batches_ordered(self) -> EngineSettings:
        # Field names in these messages read as option names on serve's command line.
        if self.no_draft_batch < self.full_draft_batch:
            raise ValueError("no_draft_batch must be >= full_draft_batch")
        if self.step_log_dir is not None and self.drafter is not None:
            raise ValueError("step_log_dir logs the index's drafts alone: not with drafter.model")
        if self.exchange_url is not None and self.exchange_dir is not None:
            raise ValueError("choose one exchange: exchange_dir (one machine) or exchange_url (Redis)")
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
