"""Settings of a replay run (the Python API's ``ReplayConfig``)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentspec.replay.cost import CostModel
from agentspec.replay.settings import ProposerSettings

DEFAULT_PROPOSERS = ("none", "vllm-ngram", "vllm-suffix", "vllm-suffix-0.32", "agentspec", "oracle")
#: Proposers whose state spans calls and that are pinned by group by default.
SESSION_AWARE = frozenset({"agentspec", "agentspec-hybrid", "agentspec-hybrid-arctic", "oracle"})


class Routing(str, Enum):
    """How calls are routed to replicas (each replica has its own proposer state)."""

    #: Every call lands anywhere: a stable hash of (trajectory, turn).
    SPREAD = "spread"
    #: A session's calls stay on one replica.
    SESSION = "session"
    #: A group's sessions stay on one replica.
    GROUP = "group"
    #: What agentspec's session-aware client does: a group is pinned by rendezvous hashing
    #: with bounded load over the trajectories in flight (agentspec.client.routing.PinTable).
    CLIENT = "client"


def bundled_data() -> Path:
    """The small slice of recorded trajectories shipped with the package."""
    return Path(__file__).parent / "data" / "slice.jsonl.gz"


class ReplayConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Trajectories file (``.jsonl`` or ``.jsonl.gz``); None = the bundled slice.
    data: Path | None = None
    #: Sources to replay (None = every source in the file, in file order).
    sources: tuple[str, ...] | None = None
    #: At most this many trajectories per source (file order).
    limit: int | None = Field(default=None, ge=1)
    proposers: tuple[str, ...] = DEFAULT_PROPOSERS
    #: Simulated servers; each holds its own proposer state.
    replicas: int = Field(default=1, ge=1)
    #: Routing per proposer; a proposer not named here uses ``default_routing``,
    #: or when that is None: group pinning for agentspec and the oracle, spread
    #: for the vLLM baselines (what a session-unaware router does).
    routing: dict[str, Routing] = Field(default_factory=dict)
    default_routing: Routing | None = None
    #: Replicas exchange finished outputs (agentspec's ``exchange_dir``): after each call,
    #: what its replica would publish is indexed by every other replica of the proposer.
    #: Only proposers that implement :class:`~agentspec.replay.proposer.SharesOutputs` take
    #: part; the others are unaffected.
    exchange: bool = False
    #: With ``exchange``: an output reaches the other replicas this many calls (of the
    #: replayed source, across its sessions) after its own call ended, as a real exchange
    #: delivers it a poll interval and a network hop later (recordings carry no times).
    exchange_lag: int = Field(default=0, ge=0)
    #: Condenser emulation: prompts keep system + first user + recent messages
    #: within this many tokens (None = whole prompts).
    window: int | None = Field(default=None, ge=1)
    #: Condenser seeding (openhands-agentspec's ``SeedingCondenser``): what the window drops
    #: from a session's prompt is sent with that call as ``prior_turn`` seeds. Needs ``window``.
    seed_dropped: bool = False
    #: Trajectories in flight at once; their turns are interleaved round robin.
    concurrency: int = Field(default=8, ge=1)
    #: The calls in flight decode a step each in turn, as one server batch does, instead of
    #: one whole call after another: calls in flight (a group's siblings) draft from each
    #: other's partial outputs rather than finished ones; agentspec's drafts get the caps
    #: of the server's default batch budget for the calls in flight on their replica.
    lockstep: bool = False
    #: Sources replayed in parallel processes.
    jobs: int = Field(default=1, ge=1)
    cache_dir: Path | None = None
    #: A Hugging Face tokenizer's folder to replay in (None: Qwen2.5's tokenizer, or the
    #: drafter's target's when a drafter is given: a drafter drafts in its target's tokens).
    tokenizer: Path | None = None
    #: Ratios in reports are relative to this proposer, one of ``proposers``
    #: (default: vllm-suffix when it runs, else the first proposer).
    baseline: str = "vllm-suffix"
    proposer_settings: ProposerSettings = ProposerSettings()
    cost: CostModel = CostModel()
    #: Sample index memory every this many calls (it is not free to measure).
    memory_every: int = Field(default=256, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _default_baseline(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("baseline") is None:
            proposers = tuple(data.get("proposers") or DEFAULT_PROPOSERS)
            data = {**data, "baseline": "vllm-suffix" if "vllm-suffix" in proposers or not proposers else proposers[0]}
        return data

    @model_validator(mode="after")
    def _baseline_runs(self) -> ReplayConfig:
        if self.baseline not in self.proposers:
            raise ValueError(f"baseline {self.baseline!r} is not among the proposers run ({', '.join(self.proposers)})")
        return self

    @field_validator("proposers")
    @classmethod
    def _unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("at least one proposer")
        if len(set(v)) != len(v):
            raise ValueError(f"proposers repeat: {v}")
        return v

    @model_validator(mode="after")
    def _seeding_needs_a_window(self) -> ReplayConfig:
        if self.seed_dropped and self.window is None:
            raise ValueError("seed_dropped seeds what the window drops: give a window too")
        return self

    @model_validator(mode="after")
    def _routing_names(self) -> ReplayConfig:
        unknown = set(self.routing) - set(self.proposers)
        if unknown:
            raise ValueError(f"routing given for proposers not run: {sorted(unknown)}")
        return self

    def tokenizer_folder(self) -> Path | None:
        """The tokenizer the calls are replayed in (see ``tokenizer``)."""
        if self.tokenizer is not None:
            return self.tokenizer
        drafter = self.proposer_settings.drafter
        return drafter.target if drafter is not None else None

    def data_path(self) -> Path:
        return self.data if self.data is not None else bundled_data()

    def routing_for(self, proposer: str) -> Routing:
        if proposer in self.routing:
            return self.routing[proposer]
        if self.default_routing is not None:
            return self.default_routing
        return Routing.GROUP if proposer in SESSION_AWARE else Routing.SPREAD


def parse_routing(text: str) -> tuple[Routing | None, dict[str, Routing]]:
    """``"group"`` or ``"agentspec=group,vllm-suffix=spread"`` (or a mix: a bare
    policy sets the default for proposers not named)."""
    default: Routing | None = None
    per: dict[str, Routing] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, policy = part.rpartition("=")
        try:
            value = Routing(policy.strip())
        except ValueError:
            raise ValueError(f"unknown routing {policy!r}; use {', '.join(r.value for r in Routing)}") from None
        if sep:
            per[name.strip()] = value
        else:
            default = value
    return default, per
