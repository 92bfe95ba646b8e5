"""The documentation's measured figures, from the JSON the measuring commands wrote.

Results measured once, on hardware or data the tests do not have, are kept in
``benchmarks/results/`` as the JSON their commands wrote (:data:`COMMANDS`; that folder's
README lists them). The docs use them two ways:

- **Tables** are not typed: a page holds a marker ``<!-- agentspec:table NAME -->`` and the
  site's build (``scripts/mkdocs_hooks.py``) puts the table :data:`TABLES` makes from the
  JSON in its place, with a line naming the file and its command.
- **Figures quoted in the text** are typed, and :func:`figures` says where each comes from:
  the page, the words around it (``{}`` where the figure stands), and the value in the JSON
  with the format that writes it. Wrapped lines count as one space. A page is named from
  ``docs/``: the repository's READMEs quote figures too (``../README.md``,
  ``../data/README.md``, ``../integrations/rl/README.md``).

This script checks every such figure against the JSON, and that every table marker names
a table that renders from it:

    python scripts/check_doc_figures.py [--docs DIR] [--results DIR]

It prints how many figures and tables it checked, and exits 1 when a page shows a figure
the JSON does not give, a passage is gone from its page, a marker is unknown, or nothing
was checked at all. It reads JSON and Markdown only: no site build, no agentspec import.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"

#: The development set's replays (docs/data.md), as the commands wrote them, gzip-compressed.
TARGETS = "dev-replay-targets.json.gz"
LOCKSTEP = "dev-lockstep.json.gz"
LAG8 = "dev-exchange-lag-8.json.gz"
LAG64 = "dev-exchange-lag-64.json.gz"
#: The development set replayed whole with three speed models: the tokens/s estimate of docs/speed.md.
SPEED_DEV = "dev-speed.json.gz"
#: The bundled slice (``agentspec bench`` without ``--data``) with the same three speed models (docs/speed.md).
SPEED_SLICE = "slice-speed.json.gz"
#: openhands_mocks of the development set with a 1024-token window, without and with condenser
#: seeding (docs/bench.md; its whole prompts are the one-server replay's).
WINDOW = "dev-openhands-window-1024.json.gz"
WINDOW_SEEDED = "dev-openhands-window-1024-seeded.json.gz"
#: Decoding steps timed on one H200 (docs/speed.md).
STEPS = "h200-step-times.json"
STEPS_70B = "h200-step-times-70b-40-layers.json"
#: The speed model against those steps: its defaults, refits and the textbook roofline (docs/speed.md).
CALIBRATION = "h200-speed-calibration.json"
#: The Redis exchange's throughput and the cost of indexing peers' outputs (docs/fleet.md).
EXCHANGE_THROUGHPUT = "exchange-throughput.json"
#: The live benchmark on the real model, on this project's 2-core CPU (docs/bench.md).
LIVE = "live-smollm2-cpu.json"
#: One pass of candidate drafters beside the real model's step, on the same CPU (docs/engine.md).
DRAFTER_COST = "drafter-cost-smollm2-cpu.json"
#: A drafter trained on the real model's own outputs (docs/drafter.md), and the live
#: benchmark with it: vLLM's eagle3 with the head alone, and agentspec's hybrid.
DRAFTER_TRAIN = "drafter-train-smollm2-cpu.json"
LIVE_DRAFTER = "live-drafter-smollm2-cpu.json"
#: A second run of the index alone and both hybrids on the conversations, right after.
LIVE_DRAFTER_RECHECK = "live-drafter-recheck-smollm2-cpu.json"
#: The replay with that head (agentspec bench --drafter) of the real model's own answers on
#: the live benchmark's workloads (docs/drafter.md).
REPLAY_DRAFTER = "replay-drafter-smollm2-cpu.json"
#: RL groups live on the real model: two engines at once, and epochs across a real policy update (docs/rl.md).
RL_LIVE = "rl-live-smollm2-cpu.json"
#: Its routing part again with two calls in flight per engine: a group's samples queued (docs/rl.md).
RL_LIVE_QUEUED = "rl-live-queued-smollm2-cpu.json"
#: The hybrid's addressable share on the development set (docs/engine.md).
HYBRID_SHARE = "dev-hybrid-share.json"
#: The draft policy's sweep on 20 trajectories of five sources of the development set (docs/policy.md).
SWEEP = "dev-policy-sweep.json"
#: A fitted draft chooser against the calibrated score, on 30 trajectories of each source (docs/policy.md).
CHOOSER = "dev-chooser-fit.json"
#: Where the index's time per call goes, on 4 mini_swe_agent trajectories (docs/policy.md).
INDEX_COST = "dev-index-cost.json"
#: A choice among the index's drafts made in hindsight, 20 trajectories of each source (docs/policy.md).
HEADROOM = "dev-choice-headroom.json"
#: 40 trajectories of each source with the default policy and with longer drafts (docs/policy.md).
BENCH40 = "dev-bench-40.json.gz"
BENCH40_LONG = "dev-bench-40-long-drafts.json.gz"
LONG_DRAFTS = '{"min_token_prob": 0.05, "max_spec_factor": 4}'
#: RL groups pinned by the rollout client against spread, on 8 replicas: the first 60 groups
#: of codet and tot, without and with the exchange, and all groups without it (docs/rl.md).
RL_ROUTING_60 = "dev-rl-routing-60.json"
RL_ROUTING_60_EXCHANGE = "dev-rl-routing-60-exchange.json"
RL_ROUTING = "dev-rl-routing.json"
#: RL's successive epochs on one server, all groups of codet and tot (docs/rl.md).
RL_EPOCHS = "dev-rl-epochs.json"
#: agentspec against vLLM 0.34's suffix method and 0.32's tree on the development set.
SUFFIX_034 = "dev-suffix-034.json.gz"
#: The live benchmark on vLLM 0.34's CPU build (Triton's interpreter running its kernels).
LIVE_034 = "live-smollm2-cpu-vllm034.json"

#: The command that wrote each file (run from the repository's root; a ``.json.gz`` is the
#: ``.json`` it wrote, compressed by ``gzip -9n``).
COMMANDS: dict[str, str] = {
    TARGETS: "python benchmarks/replay_targets.py --data data/trajectories-dev.jsonl.gz --json dev-replay-targets.json",
    LOCKSTEP: (
        "agentspec bench --data data/trajectories-dev.jsonl.gz --proposers vllm-suffix,agentspec --lockstep"
        " --json dev-lockstep.json"
    ),
    **{
        lag: (
            "agentspec bench --data data/trajectories-dev.jsonl.gz --proposers agentspec --replicas 8 --routing group"
            f" --exchange --exchange-lag {n} --json {lag.removesuffix('.gz')}"
        )
        for n, lag in ((8, LAG8), (64, LAG64))
    },
    SPEED_DEV: (
        "agentspec bench --data data/trajectories-dev.jsonl.gz --proposers vllm-suffix,agentspec"
        " --speed-model h100:8b --speed-model h200:8b --speed-model h100:70b --jobs 1 --json dev-speed.json"
    ),
    SPEED_SLICE: (
        "agentspec bench --proposers vllm-suffix,agentspec --speed-model h100:8b --speed-model h200:8b"
        " --speed-model h100:70b --json slice-speed.json"
    ),
    **{
        file: (
            "agentspec bench --data data/trajectories-dev.jsonl.gz --sources openhands_mocks"
            f" --proposers vllm-suffix,agentspec,oracle --window 1024{flag} --json {file.removesuffix('.gz')}"
        )
        for file, flag in ((WINDOW, ""), (WINDOW_SEEDED, " --seed-dropped"))
    },
    STEPS: "python benchmarks/gpu_step_time.py --models 8b,32b --out h200-step-times.json",
    STEPS_70B: "python benchmarks/gpu_step_time.py --models 70b --layers 40 --out h200-step-times-70b-40-layers.json",
    CALIBRATION: (
        "python benchmarks/speed_calibration.py benchmarks/results/h200-step-times.json"
        " benchmarks/results/h200-step-times-70b-40-layers.json --gpu h200 --json h200-speed-calibration.json"
    ),
    EXCHANGE_THROUGHPUT: "python benchmarks/exchange_throughput.py --json exchange-throughput.json",
    LIVE: "python benchmarks/live_bench.py --cache-dir .cache/real-model --runs 3 --json live-smollm2-cpu.json",
    DRAFTER_COST: (
        "python benchmarks/drafter_cost.py --cache-dir .cache/real-model --json drafter-cost-smollm2-cpu.json"
    ),
    DRAFTER_TRAIN: (
        "agentspec train-drafter .cache/real-model/smollm2-135m-instruct-b179c9523d0e-v1 --data own.jsonl"
        " --out own-head --steps 150 --draft-vocab 8192 --max-tokens 384 --eval-fraction 0.12"
        " (own.jsonl: python benchmarks/live_bench.py --cache-dir .cache/real-model --servers none"
        " --data data/trajectories-dev.jsonl.gz --exclude agentspec/replay/data/slice.jsonl.gz --workloads dev"
        " --sessions 48 --turns 3 --max-tokens 128 --runs 1 --transcripts own.jsonl); its training.json"
    ),
    LIVE_DRAFTER: (
        "python benchmarks/live_bench.py --cache-dir .cache/real-model"
        " --servers none,vllm-suffix,eagle3,agentspec,hybrid,hybrid-arctic --drafter own-head --runs 1"
        " --json live-drafter-smollm2-cpu.json"
    ),
    LIVE_034: (
        "AGENTSPEC_TRITON_INTERPRETER=1 PYTHONPATH=scripts/lib/vllm_cpu_site .venv-vllm034/bin/python"
        " benchmarks/live_bench.py --cache-dir .cache/real-model --servers none,vllm-suffix,agentspec --runs 3"
        " --json live-smollm2-cpu-vllm034.json"
    ),
    SUFFIX_034: (
        "agentspec bench --data data/trajectories-dev.jsonl.gz --proposers vllm-suffix,vllm-suffix-0.32,agentspec"
        " --json dev-suffix-034.json"
    ),
    RL_LIVE: "python benchmarks/rl_live.py --cache-dir .cache/real-model --runs 3 --json rl-live-smollm2-cpu.json",
    RL_LIVE_QUEUED: (
        "python benchmarks/rl_live.py --cache-dir .cache/real-model --parts routing --concurrency 2 --runs 3"
        " --json rl-live-queued-smollm2-cpu.json"
    ),
    LIVE_DRAFTER_RECHECK: (
        "python benchmarks/live_bench.py --cache-dir .cache/real-model --servers agentspec,hybrid,hybrid-arctic"
        " --workloads dev --drafter own-head --runs 1 --json live-drafter-recheck-smollm2-cpu.json"
    ),
    REPLAY_DRAFTER: (
        "agentspec bench --data own-slice.jsonl --drafter own-head"
        " --target .cache/real-model/smollm2-135m-instruct-b179c9523d0e-v1 --concurrency 4"
        " --json replay-drafter-smollm2-cpu.json (own-slice.jsonl: python benchmarks/live_bench.py"
        " --cache-dir .cache/real-model --servers none --workloads dev,loop --sessions 4 --turns 3 --max-tokens 96"
        " --window 1536 --concurrency 4 --runs 1 --transcripts own-slice.jsonl)"
    ),
    HYBRID_SHARE: (
        "python benchmarks/hybrid_share.py --data data/trajectories-dev.jsonl.gz --jobs 1 --json dev-hybrid-share.json"
    ),
    SWEEP: (
        "python benchmarks/policy_sweep.py --data data/trajectories-dev.jsonl.gz --limit 20"
        " --json dev-policy-sweep.json"
    ),
    CHOOSER: (
        "python benchmarks/chooser_fit.py --data data/trajectories-dev.jsonl.gz --limit 30 --json dev-chooser-fit.json"
    ),
    INDEX_COST: "python benchmarks/index_cost.py --data data/trajectories-dev.jsonl.gz --json dev-index-cost.json",
    HEADROOM: (
        "python benchmarks/choice_headroom.py --data data/trajectories-dev.jsonl.gz --limit 20"
        " --json dev-choice-headroom.json"
    ),
    BENCH40: (
        "agentspec bench --data data/trajectories-dev.jsonl.gz --limit 40 --proposers vllm-suffix,agentspec"
        " --speed-model h100:8b --json dev-bench-40.json"
    ),
    BENCH40_LONG: (
        "agentspec bench --data data/trajectories-dev.jsonl.gz --limit 40 --proposers vllm-suffix,agentspec"
        f" --speed-model h100:8b --agentspec-policy '{LONG_DRAFTS}' --json dev-bench-40-long-drafts.json"
    ),
    RL_ROUTING_60: (
        "python benchmarks/rl_routing.py --data data/trajectories-dev.jsonl.gz --limit 60 --json dev-rl-routing-60.json"
    ),
    RL_ROUTING_60_EXCHANGE: (
        "python benchmarks/rl_routing.py --data data/trajectories-dev.jsonl.gz --limit 60 --exchange"
        " --json dev-rl-routing-60-exchange.json"
    ),
    RL_ROUTING: "python benchmarks/rl_routing.py --data data/trajectories-dev.jsonl.gz --json dev-rl-routing.json",
    RL_EPOCHS: "python benchmarks/rl_epochs.py --data data/trajectories-dev.jsonl.gz --json dev-rl-epochs.json",
}

TABLE_MARKER = re.compile(r"<!-- agentspec:table ([\w.-]+) -->")
BASE, OURS, ALL = "vllm-suffix", "agentspec", "all"


class Results:
    """The JSON files of one results folder, each read once."""

    def __init__(self, folder: Path = RESULTS) -> None:
        self.folder = Path(folder)
        self._files: dict[str, Any] = {}

    def json(self, name: str) -> Any:
        if name not in self._files:
            raw = (self.folder / name).read_bytes()
            self._files[name] = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
        return self._files[name]


# ---------------------------------------------------------------------------- values


class Value:
    """A number in the results (:class:`Get`), or one computed from such numbers (:class:`Calc`)."""

    def __call__(self, results: Results) -> float:
        raise NotImplementedError

    def map(self, fn: Callable[[float], float], what: str) -> Calc:
        return Calc(fn, (self,), what)


@dataclass(frozen=True)
class Get(Value):
    """The number at ``path`` in ``file``. A step is a key, a list index, or a mapping that
    picks the one list item whose fields have those values; ``count`` takes the length of
    the list found instead."""

    file: str
    path: tuple[Any, ...]
    count: bool = False

    def __call__(self, results: Results) -> float:
        node = results.json(self.file)
        for step in self.path:
            if isinstance(step, Mapping):
                found = [item for item in node if all(item.get(k) == v for k, v in step.items())]
                if len(found) != 1:
                    raise LookupError(f"{self}: {len(found)} items match")
                node = found[0]
            else:
                node = node[step]
        if self.count:
            return float(len(node))
        if isinstance(node, bool) or not isinstance(node, (int, float)):
            raise LookupError(f"{self} is not a number: {node!r}")
        return float(node)

    def __str__(self) -> str:
        parts: list[str] = []
        for step in self.path:
            if isinstance(step, Mapping):
                parts.append("[" + ",".join(f"{k}={v}" for k, v in step.items()) + "]")
            else:
                parts.append(f".{step}" if parts else str(step))
        return f"{'len ' if self.count else ''}{self.file}:{''.join(parts)}"


@dataclass(frozen=True)
class Calc(Value):
    fn: Callable[..., float]
    args: tuple[Value, ...]
    what: str

    def __call__(self, results: Results) -> float:
        return self.fn(*(arg(results) for arg in self.args))

    def __str__(self) -> str:
        return f"{self.what} of (" + "; ".join(str(arg) for arg in self.args) + ")"


def record(file: str, run: str | None, proposer: str, source: str, field: str) -> Get:
    """A field of one (proposer, source) record of a replay's JSON; ``run`` is the replay's
    key in a file that holds several."""
    head: tuple[Any, ...] = (run,) if run else ()
    return Get(file, (*head, "records", {"proposer": proposer, "source": source}, field))


def ratio(a: Value, b: Value) -> Calc:
    return Calc(lambda x, y: x / y, (a, b), "ratio")


def one(proposer: str, source: str = ALL, field: str = "al") -> Get:
    """benchmarks/replay_targets.py, one server."""
    return record(TARGETS, "one_server", proposer, source, field)


def eight(proposer: str, source: str = ALL, field: str = "al") -> Get:
    """benchmarks/replay_targets.py, 8 replicas: agentspec pinned by group, vllm-suffix spread."""
    return record(TARGETS, "eight_replicas", proposer, source, field)


def exchanging(proposer: str, source: str = ALL, field: str = "al") -> Get:
    """benchmarks/replay_targets.py, 8 replicas, agentspec's exchanging finished outputs."""
    return record(TARGETS, "eight_replicas_exchanging", proposer, source, field)


def windowed(proposer: str, field: str = "al") -> Get:
    """benchmarks/replay_targets.py, mini_swe_agent with a 4000-token window."""
    return record(TARGETS, "window_4000", proposer, ALL, field)


def fleet(run: str, source: str = ALL) -> Get:
    """agentspec's AL on 8 replicas pinned by group: without the exchange (``apart``), with it
    at once (``lag 0``, both benchmarks/replay_targets.py) and with outputs delivered 8 or 64
    calls late (``lag 8``, ``lag 64``: agentspec bench --exchange-lag)."""
    if run == "apart":
        return eight(OURS, source)
    if run == "lag 0":
        return exchanging(OURS, source)
    return record({"lag 8": LAG8, "lag 64": LAG64}[run], None, OURS, source, "al")


FLEET_RUNS = ("apart", "lag 0", "lag 8", "lag 64")


def percent(value: Value) -> Calc:
    return value.map(lambda share: share * 100, "percent of a share")


def ms(value: Value) -> Calc:
    return value.map(lambda us: us / 1e3, "ms from µs")


def gb(value: Value) -> Calc:
    """Thousands of the replay's MB (MiB), as the pages write them."""
    return value.map(lambda mb: mb / 1000, "GB from MB")


def step_ms(file: str, model: str, context: int, batch: int, verified: int) -> Calc:
    row = {"model": model, "context": context, "batch": batch, "verified": verified}
    return Get(file, ("rows", row, "seconds")).map(lambda s: s * 1e3, "ms from s")


def acceptance_ratio(source: str = ALL) -> Calc:
    return ratio(one(OURS, source, "acceptance_rate"), one(BASE, source, "acceptance_rate"))


def peak_ratio(source: str) -> Calc:
    return ratio(one(OURS, source, "peak_index_mb"), one(BASE, source, "peak_index_mb"))


def index_fraction(source: str = "mini_swe_agent") -> Calc:
    """agentspec's index time per call as a fraction 1/x of vllm-suffix's: x."""
    return ratio(one(BASE, source, "index_us_per_call"), one(OURS, source, "index_us_per_call"))


def sources(results: Results, file: str, run: str | None = None) -> list[str]:
    """A replay's sources in its order, then ``all``."""
    data = results.json(file)
    data = data[run] if run else data
    return list(dict.fromkeys(r["source"] for r in data["records"]))


# ---------------------------------------------------------------------------- figures in prose


@dataclass(frozen=True)
class Figure:
    """The figures one passage of a page quotes: ``text`` with ``{}`` where each stands, and
    for each the value it shows and its format spec (``format(value, spec)``)."""

    page: str
    text: str
    values: tuple[tuple[Value, str], ...]

    def expected(self, results: Results) -> str:
        return self.text.format(*(format(value(results), spec) for value, spec in self.values))


def fig(page: str, text: str, *values: tuple[Value, str]) -> Figure:
    if text.count("{}") != len(values):
        raise ValueError(f"{page}: {text!r} has {text.count('{}')} places for {len(values)} values")
    return Figure(page, text, values)


F1, F2, F3 = ".1f", ".2f", ".3f"


def figures() -> Iterator[Figure]:
    """Every figure the docs quote from the results, page by page."""
    mini = "mini_swe_agent"
    al_ratio = one(OURS, field="al_vs_baseline")
    eight_ratio = eight(OURS, field="al_vs_baseline")
    shared_ratio = exchanging(OURS, field="al_vs_baseline")
    suffix_mini_index = ms(one(BASE, mini, "index_us_per_call"))

    # rl.md: RL groups live on the real model
    def rl_live(*path: Any) -> Get:
        return Get(RL_LIVE, ("summary", *path))

    yield fig(
        "rl.md",
        "Epoch 2's AL with the old\n  outputs kept is {}x its AL with them retired",
        (rl_live("epochs", "arms", "kept", "al_over_retired", 0), F2),
    )
    yield fig(
        "rl.md",
        "it moved the trained samples' mean log-probability by {} nats per token",
        (rl_live("epochs", "logp_shift", 0), F3),
    )
    yield fig(
        "rl.md",
        "Kept runs at {}x the\n  tokens/s of retired",
        (rl_live("epochs", "arms", "kept", "over_retired", 0), F2),
    )
    yield fig(
        "rl.md",
        "the same AL ({} and {})",
        (rl_live("routing", "agentspec, pinned", "al", 0), F2),
        (rl_live("routing", "agentspec, spread", "al", 0), F2),
    )
    yield fig(
        "rl.md",
        "agentspec's AL is {} against {},\n  and its tokens/s {}x",
        (rl_live("routing", "agentspec, pinned", "al", 0), F2),
        (rl_live("routing", "vllm-suffix, pinned", "al", 0), F2),
        (rl_live("routing", "agentspec, pinned", "over_suffix", 0), F2),
    )
    yield fig(
        "rl.md",
        "Pinned over spread is {}x in AL and {}x in tokens/s",
        (Get(RL_LIVE_QUEUED, ("summary", "routing", "agentspec, pinned", "al_over_spread", 0)), F2),
        (Get(RL_LIVE_QUEUED, ("summary", "routing", "agentspec, pinned", "over_spread", 0)), F2),
    )
    yield fig(
        "rl.md",
        "score a trained sample within {} nats per token",
        (rl_live("epochs", "engine_vs_trainer_logp_gap"), ".4f"),
    )

    # bench.md and the README: the live benchmark on the real model
    yield fig(
        "bench.md",
        "(AL {} against {}) and delivers {}x its tokens/s",
        (live("dev", OURS, "al"), F2),
        (live("dev", BASE, "al"), F2),
        (live("dev", OURS, "vs_vllm_suffix"), F2),
    )
    yield fig(
        "bench.md",
        "its AL is higher too ({} against {}) but tokens/s are even ({}x)",
        (live("loop", OURS, "al"), F2),
        (live("loop", BASE, "al"), F2),
        (live("loop", OURS, "vs_vllm_suffix"), F2),
    )
    yield fig(
        "bench.md",
        "at a lower acceptance rate ({} against {} on the loops)",
        (live("loop", OURS, "acceptance"), F3),
        (live("loop", BASE, "acceptance"), F3),
    )
    for workload, what in LIVE_WORKLOADS.items():
        yield fig(
            "../README.md",
            f"| {workload}: {what} | " + "{} | {} | {} | {} |",
            (live(workload, OURS, "vs_vllm_suffix"), F2),
            (live(workload, OURS, "vs_none"), F2),
            (live(workload, OURS, "al"), F2),
            (live(workload, BASE, "al"), F2),
        )
    yield fig(
        "../README.md",
        "AL agentspec / vllm-suffix {} on one server and {} on eight replicas exchanging outputs",
        (one(OURS, field="al_vs_baseline"), F3),
        (exchanging(OURS, field="al_vs_baseline"), F3),
    )

    # drafter.md: the head trained on the real model's outputs, and the hybrid live with it
    yield fig(
        "drafter.md",
        "the target's own choice for {} of the\noutput tokens, and for {} of those",
        (trained("acceptance", 0), F3),
        (trained("hard_acceptance"), F3),
    )
    hybrid, index_only = live_drafter("dev", "hybrid", "al"), live_drafter("dev", OURS, "al")
    yield fig(
        "drafter.md",
        "the hybrid's AL is {} against {} for the\n  index alone ({}x)",
        (hybrid, F2),
        (index_only, F2),
        (ratio(hybrid, index_only), F2),
    )
    yield fig(
        "drafter.md",
        "drafts made {} of the tokens decoded",
        (live_drafter("dev", "hybrid", "model_share_recovered"), F3),
    )
    yield fig(
        "drafter.md",
        "the AL is {} against {}: the head's",
        (live_drafter("loop", "hybrid", "al"), F2),
        (live_drafter("loop", OURS, "al"), F2),
    )
    yield fig(
        "drafter.md",
        "more tokens/s than the head alone ({}\n  against {} on the conversations)",
        (live_drafter("dev", "hybrid", "tokens_per_s"), F1),
        (live_drafter("dev", "eagle3", "tokens_per_s"), F1),
    )
    yield fig(
        "drafter.md",
        "fewer than the index alone ({}) and\n  than vLLM's suffix method ({}x)",
        (live_drafter("dev", OURS, "tokens_per_s"), F1),
        (live_drafter("dev", "hybrid", "vs_vllm_suffix"), F2),
    )
    yield fig(
        "drafter.md",
        "By Arctic Inference's rule the AL is {} on the conversations\n  and {} on the repair loops",
        (live_drafter("dev", "hybrid-arctic", "al"), F2),
        (live_drafter("loop", "hybrid-arctic", "al"), F2),
    )
    yield fig(
        "drafter.md",
        "its passes\n  are skipped on {} of the conversations' steps, against {})",
        (live_drafter("dev", "hybrid-arctic", "drafter_skip_share"), F3),
        (live_drafter("dev", "hybrid", "drafter_skip_share"), F3),
    )
    recheck = [
        Get(LIVE_DRAFTER_RECHECK, ("summary", "dev", server, "tokens_per_s", 0))
        for server in (OURS, "hybrid", "hybrid-arctic")
    ]
    yield fig(
        "drafter.md",
        "the index alone,\n    the hybrid and the hybrid by Arctic's rule gave {}, {} and {} tokens/s",
        *((value, F1) for value in recheck),
    )
    yield fig(
        "drafter.md", "slower than no\n  speculation at all ({}x)", (live_drafter("dev", "eagle3", "vs_none"), F2)
    )
    yield fig(
        "drafter.md",
        "trained for 150 steps on {} output tokens",
        (Get(DRAFTER_TRAIN, ("result", "output_tokens")), ",.0f"),
    )

    # drafter.md: the replay with the trained head
    def replayed(proposer: str, source: str = ALL, field: str = "al") -> Get:
        return record(REPLAY_DRAFTER, None, proposer, source, field)

    hybrid_counters = ("records", {"proposer": "agentspec-hybrid", "source": ALL}, "counters")
    yield fig(
        "drafter.md",
        "the hybrid's AL is {} against\n  {} for the index alone ({}x). On the repair loops it is {}\n  against {}.",
        (replayed("agentspec-hybrid", "live-dev"), F2),
        (replayed(OURS, "live-dev"), F2),
        (ratio(replayed("agentspec-hybrid", "live-dev"), replayed(OURS, "live-dev")), F2),
        (replayed("agentspec-hybrid", "live-loop"), F2),
        (replayed(OURS, "live-loop"), F2),
    )
    yield fig(
        "drafter.md",
        "Live, the same workloads gave {} against {}, and {} against\n  {} (the table above)",
        (live_drafter("dev", "hybrid", "al"), F2),
        (live_drafter("dev", OURS, "al"), F2),
        (live_drafter("loop", "hybrid", "al"), F2),
        (live_drafter("loop", OURS, "al"), F2),
    )
    yield fig(
        "drafter.md",
        "its AL is {} against {} overall",
        (replayed("agentspec-hybrid-arctic"), F2),
        (replayed("agentspec-hybrid"), F2),
    )
    yield fig(
        "drafter.md",
        "the head's accepted drafts made {} of the tokens those steps decoded",
        (
            ratio(
                Get(REPLAY_DRAFTER, (*hybrid_counters, "hard_step_model_accepted_tokens")),
                Get(REPLAY_DRAFTER, (*hybrid_counters, "hard_step_tokens")),
            ),
            F3,
        ),
    )
    yield fig("drafter.md", "The run took {} s on two CPU cores", (Get(REPLAY_DRAFTER, ("settings", "wall_s")), ".0f"))
    yield fig(
        "drafter.md",
        "for {} calls: the target runs three times",
        (replayed("none", ALL, "calls"), ".0f"),
    )

    # engine.md: what a drafter's pass costs beside the real model's step
    yield fig(
        "engine.md",
        "The output layer alone (576 × 49,152) costs {} of a target step",
        (drafter_pass("output layer"), F3),
    )
    yield fig("engine.md", "so it costs {} of a step with one layer", (drafter_pass("draft model, 1 layers"), F3))
    yield fig(
        "engine.md",
        "with a head over 16,384 draft tokens costs {}",
        (drafter_pass("one layer + head over 16,384"), F3),
    )

    # engine.md: the hybrid's addressable share, benchmarks/hybrid_share.py
    yield fig(
        "engine.md",
        "Over all sources, {} steps: {}% of them have no draft expected to deliver 2 tokens, and {}% of the output"
        " tokens are decoded on those steps.",
        (share(ALL, "steps"), ",.0f"),
        (percent(share(ALL, "below_step_share", "2.0")), F1),
        (percent(share(ALL, "below_token_share", "2.0")), F1),
    )
    yield fig(
        "engine.md",
        "its drafts with E in 1–2 got {} tokens accepted per step, E in 2–4 got {}.",
        (accepted_between("1.0", "2.0"), F2),
        (accepted_between("2.0", "4.0"), F2),
    )

    yield fig(
        "engine.md",
        "on the dev set the index drafts nothing on {}% of decoding steps and has a draft expected to deliver fewer"
        " than 2 tokens on {}%",
        (percent(share(ALL, "no_draft_step_share")), ".0f"),
        (percent(share(ALL, "below_step_share", "2.0")), ".0f"),
    )

    # engine.md: the fixed rule and the model budget on the development set (speed.md's run), and H200 steps
    fixed_rule, model_budget = (
        [ratio(tokens_per_s("h100:8b", row, c), tokens_per_s("h100:8b", BASE, c)) for c in (32, 64, 128)]
        for row in ("agentspec (fixed rule)", "agentspec (model budget)")
    )
    yield fig(
        "engine.md",
        "estimates the rule at {} to {} of vLLM's suffix method's tokens/s at 32 to 128 requests (8B on an H100,"
        " [development set](data.md#the-development-set)), where the model budget below stays at {} to {} of it",
        (Calc(lambda *r: min(r), tuple(fixed_rule), "least"), F2),
        (Calc(lambda *r: max(r), tuple(fixed_rule), "most"), F2),
        (Calc(lambda *r: min(r), tuple(model_budget), "least"), F2),
        (Calc(lambda *r: max(r), tuple(model_budget), "most"), F2),
    )
    yield fig(
        "engine.md",
        "a step of one request costs {} ms with 1 verified token and {} ms with 16",
        (step_ms(STEPS, "8b", 8192, 1, 1), F1),
        (step_ms(STEPS, "8b", 8192, 1, 16), F1),
    )

    # policy.md: the development set, benchmarks/replay_targets.py
    yield fig("policy.md", "replays all {} calls of the [development set]", (one(OURS, field="calls"), ",.0f"))
    yield fig(
        "policy.md",
        "eight agentspec replicas draft as well as one agentspec server (AL {} and {})",
        (exchanging(OURS), F3),
        (one(OURS), F3),
    )
    yield fig(
        "policy.md",
        "({} ms on their own, {} ms exchanging, against {} ms for spread vllm-suffix)",
        (ms(eight(OURS, field="index_us_per_call")), F1),
        (ms(exchanging(OURS, field="index_us_per_call")), F1),
        (ms(eight(BASE, field="index_us_per_call")), F1),
    )
    yield fig(  # a replay's peak memory over all sources is that of its largest source
        "policy.md",
        "on the largest source the eight replicas together hold {} GB of index ({} GB on their own) against {} GB"
        " for spread vllm-suffix",
        (gb(exchanging(OURS, ALL, "peak_index_mb")), F1),
        (gb(eight(OURS, ALL, "peak_index_mb")), F1),
        (gb(eight(BASE, ALL, "peak_index_mb")), F2),
    )
    yield fig(
        "policy.md",
        "mini_swe_agent with a 4000-token condenser window: AL {} (suffix) and {} (agentspec), {}.",
        (windowed(BASE), F3),
        (windowed(OURS), F3),
        (windowed(OURS, "al_vs_baseline"), F3),
    )
    yield fig(
        "policy.md",
        "Index time per call on mini_swe_agent, one server: {} ms (suffix,",
        (suffix_mini_index, F1),
    )
    yield fig(
        "policy.md",
        "and {} ms (agentspec), 1/{}",
        (ms(one(OURS, mini, "index_us_per_call")), F1),
        (index_fraction(), F1),
    )
    yield fig(
        "policy.md",
        "agentspec's index time per call is higher than suffix's, {} ms against {} ms",
        (ms(windowed(OURS, "index_us_per_call")), F1),
        (ms(windowed(BASE, "index_us_per_call")), F1),
    )
    yield fig(
        "policy.md",
        "Peak index memory on mini_swe_agent: {} MB (suffix) and {} MB (agentspec), {}x",
        (one(BASE, mini, "peak_index_mb"), ",.0f"),
        (one(OURS, mini, "peak_index_mb"), ",.0f"),
        (peak_ratio(mini), F2),
    )
    yield fig("policy.md", "met (lowest {}, mini_swe_agent)", (one(OURS, mini, "al_vs_baseline"), F3))
    yield fig("policy.md", "**1.10x overall on one server: met, {}**", (al_ratio, F3))
    yield fig(
        "policy.md",
        "met, overall {} and on every source (lowest mini_swe_agent, {},",
        (acceptance_ratio(), F3),
        (acceptance_ratio(mini), F3),
    )
    yield fig(
        "policy.md",
        "**1.20x overall on 8 replicas: met only with the exchange, {}; missed without it, {}.**",
        (shared_ratio, F3),
        (eight_ratio, F3),
    )
    yield fig(
        "policy.md",
        "(openhands_mocks {}, reflexion {} and {}, tau_bench {})",
        (eight(OURS, "openhands_mocks", "al_vs_baseline"), F2),
        (eight(OURS, "reflexion_hotpotqa_react", "al_vs_baseline"), F2),
        (eight(OURS, "reflexion_programming", "al_vs_baseline"), F2),
        (eight(OURS, "tau_bench", "al_vs_baseline"), F2),
    )
    yield fig(
        "policy.md", "**Never below vllm-suffix with a window:** met, {} (AL;", (windowed(OURS, "al_vs_baseline"), F3)
    )
    yield fig(
        "policy.md", "**Index time per call at most 1/20 of suffix's: missed, 1/{} in this run", (index_fraction(), F1)
    )
    yield fig(
        "policy.md",
        "**AL 1.25x on one server (short by {}), and 1.45x on 8 replicas (short by {}).**",
        (al_ratio.map(lambda r: 1.25 - r, "1.25 minus"), F2),
        (shared_ratio.map(lambda r: 1.45 - r, "1.45 minus"), F2),
    )
    yield fig(
        "policy.md",
        "**Acceptance 0.85 of suffix's (short by {}).**",
        (acceptance_ratio().map(lambda r: 0.85 - r, "0.85 minus"), F2),
    )
    yield fig("policy.md", "**Memory at most 2x: met on mini_swe_agent ({}x).**", (peak_ratio(mini), F2))
    yield fig(
        "policy.md",
        "codet {}x and reflexion_programming {}x",
        (peak_ratio("codet"), F2),
        (peak_ratio("reflexion_programming"), F2),
    )
    yield fig(
        "policy.md",
        "tot {}x, and up to {}x on small sources",
        (peak_ratio("tot"), F2),
        (peak_ratio("openhands_mocks"), ".0f"),
    )
    yield fig(
        "policy.md",
        "(openhands_mocks: {} MB against {} MB)",
        (one(OURS, "openhands_mocks", "peak_index_mb"), ".0f"),
        (one(BASE, "openhands_mocks", "peak_index_mb"), ".0f"),
    )

    # policy.md: the fitted chooser, benchmarks/chooser_fit.py
    yield fig(
        "policy.md",
        "Fitted on {} recorded steps ({} token events), judged on {} held steps:",
        (chooser("fit", "steps"), ",.0f"),
        (chooser("fit", "token_events"), ",.0f"),
        (chooser("held", "steps"), ",.0f"),
    )
    yield fig(
        "policy.md",
        "Log-loss {} on the fit half and {} on the held half,",
        (chooser("fit", "log_loss"), F3),
        (chooser("held", "log_loss"), F3),
    )
    yield fig(
        "policy.md",
        "the two choosers give the same AL ({} and {} of vllm-suffix's) and the fitted one a slightly lower"
        " acceptance ({} against {} of vllm-suffix's).",
        (held_vs_suffix(OURS), F3),
        (held_vs_suffix("agentspec-fitted"), F3),
        (held_vs_suffix("agentspec-fitted", "acceptance_rate"), F3),
        (held_vs_suffix(OURS, "acceptance_rate"), F3),
    )
    hindsight_gain = percent(chosen_over_calibrated("hindsight").map(lambda r: r - 1, "minus 1"))
    yield fig("policy.md", "Even the hindsight choice, {}% more accepted tokens", (hindsight_gain, F1))
    yield fig("policy.md", "a choice made with the answer known adds {}% accepted tokens", (hindsight_gain, F1))

    # policy.md: the draft policy's sweep, benchmarks/policy_sweep.py
    defaults, prob3, factor1 = {}, {"min_token_prob": 0.3}, {"max_spec_factor": 1.0, "min_token_prob": 0.1}
    uncalibrated3 = {"calibrate_levels": False, "min_token_prob": 0.3}
    acc = "acceptance_ratio"
    yield fig(
        "policy.md",
        "at the same minimum probability it raises AL ({} to {} at 0.3) and acceptance ({} to {} overall, codet {}"
        " to {}),",
        (swept(uncalibrated3), F3),
        (swept(prob3), F3),
        (swept(uncalibrated3, acc), F2),
        (swept(prob3, acc), F2),
        (swept(uncalibrated3, acc, "codet"), F2),
        (swept(prob3, acc, "codet"), F2),
    )
    yield fig("policy.md", "on this slice (mini_swe_agent {});", (swept(defaults, acc, "mini_swe_agent"), F2))
    yield fig(
        "policy.md",
        "with vLLM's draft length (factor 1.0), gain {}% here;",
        (percent(swept(factor1).map(lambda r: r - 1, "minus 1")), F1),
    )
    shallow = Calc(lambda d, s: 1 - s / d, (swept(defaults), swept({"max_depth": 32, "max_match_tokens": 16})), "less")
    yield fig(
        "policy.md",
        "match 16: 1/{}, and {}% less AL in the sweep above; depth 48: 1/{})",
        (index_cost_ratio({"max_depth": 32, "max_match_tokens": 16}), F1),
        (percent(shallow), F1),
        (index_cost_ratio({"max_depth": 48}), F1),
    )
    yield from policy_measured_figures()
    yield fig(
        "policy.md",
        "(min prob 0.3: {} and {}x; factor 1: {} and {}x)",
        (swept(prob3, acc), F2),
        (swept(prob3), F3),
        (swept(factor1, acc), F2),
        (swept(factor1), F3),
    )

    # data/README.md: the development set's size, as the replay counted it
    yield fig(
        "../data/README.md",
        "is the development set: {} recorded agent sessions and sampling groups, {} LLM calls",
        (
            Calc(
                lambda *n: sum(n),
                tuple(Get(TARGETS, ("one_server", "settings", "trajectories", s)) for s in DEV_SOURCES),
                "sum",
            ),
            ",.0f",
        ),
        (one(OURS, field="calls"), ",.0f"),
    )

    # integrations/rl/README.md (agentspec-rl's long description): the same runs, typed
    rl_readme = "../integrations/rl/README.md"
    yield fig(
        rl_readme,
        "agentspec pinned / spread: Tree-of-Thoughts {}× on the first 60 groups ({} vs {}) and {}× on all {};"
        " CodeT {}× and {}×.",
        (rl_pinning(RL_ROUTING_60, "tot"), F2),
        (rl_al(RL_ROUTING_60, "tot", "agentspec, client"), F3),
        (rl_al(RL_ROUTING_60, "tot", "agentspec, spread"), F3),
        (rl_pinning(RL_ROUTING, "tot"), F2),
        (Get(RL_ROUTING, ("sources", "tot", "trajectories")), ".0f"),
        (rl_pinning(RL_ROUTING_60, "codet"), F2),
        (rl_pinning(RL_ROUTING, "codet"), F2),
    )
    for source in ("codet", "tot"):
        yield fig(
            rl_readme,
            f"| {source} | " + "{} | {} | {} | {} | {}× |",
            (Get(RL_EPOCHS, ("sources", source, "groups")), ".0f"),
            *((epoch_two(source, arm), F3) for arm in ("vllm-suffix", "agentspec, kept", "agentspec, retired")),
            (Get(RL_EPOCHS, ("sources", source, "kept_over_retired")), F2),
        )

    # rl.md: RL groups pinned against spread, benchmarks/rl_routing.py
    yield fig("rl.md", "Pinning is worth most on the first 60 ({}×).", (rl_pinning(RL_ROUTING_60, "tot"), F2))
    same = "vLLM's suffix method reaches {} on codet's epoch 2, the same figure as its pinned AL on the first 60 codet"
    yield fig("rl.md", same, (epoch_two("codet", "vllm-suffix"), F3))
    yield fig("rl.md", same, (rl_al(RL_ROUTING_60, "codet", "vllm-suffix, client"), F3))
    yield fig(
        "rl.md",
        "The kept/retired ratio is {}× for codet and {}× for tot.",
        *((ratio(epoch_two(s, "agentspec, kept"), epoch_two(s, "agentspec, retired")), F2) for s in ("codet", "tot")),
    )
    yield fig(
        "rl.md",
        "agentspec pinned / spread is then {} / {} ({}×) for codet and {} / {} ({}×) for tot.",
        *(
            figure
            for source in ("codet", "tot")
            for figure in (
                (rl_al(RL_ROUTING_60_EXCHANGE, source, "agentspec, client"), F3),
                (rl_al(RL_ROUTING_60_EXCHANGE, source, "agentspec, spread"), F3),
                (rl_pinning(RL_ROUTING_60_EXCHANGE, source), F2),
            )
        ),
    )

    # engine.md: the same replays
    yield fig(
        "engine.md",
        "AL {}x vLLM's suffix method spread over the same eight, against {}x without the exchange",
        (shared_ratio, F3),
        (eight_ratio, F3),
    )
    yield fig(
        "engine.md",
        "(index time per call {} ms without, {} ms with the exchange, in a run on two busy cores)",
        (ms(eight(OURS, field="index_us_per_call")), F1),
        (ms(exchanging(OURS, field="index_us_per_call")), F1),
    )

    # bench.md: the one-server replay and the lockstep one
    yield fig(
        "bench.md",
        "Measured on the [development set](data.md#the-development-set)'s `openhands_mocks` ({} trajectories,"
        " {} calls;",
        (Get(TARGETS, ("one_server", "settings", "trajectories", "openhands_mocks")), ".0f"),
        (one(OURS, "openhands_mocks", "calls"), ".0f"),
    )
    yield fig(
        "bench.md",
        "On one server seeding gains nothing ({}× of the AL without it)",
        (ratio(record(WINDOW_SEEDED, None, OURS, ALL, "al"), record(WINDOW, None, OURS, ALL, "al")), F3),
    )
    lockstep_s, one_s = Get(LOCKSTEP, ("settings", "wall_s")), Get(TARGETS, ("one_server", "settings", "wall_s"))
    yield fig(
        "bench.md",
        "Lockstep took {} times as long ({} s against {} s,",
        (ratio(lockstep_s, one_s), F1),
        (lockstep_s, ".0f"),
        (one_s, ".0f"),
    )

    # tuning.md: memory on one server
    yield fig(
        "tuning.md",
        "(this took codet from 1,196 MB to {} MB and reflexion_programming from 712 MB to {} MB)",
        (one(OURS, "codet", "peak_index_mb"), ",.0f"),
        (one(OURS, "reflexion_programming", "peak_index_mb"), ",.0f"),
    )

    # fleet.md: 8 replicas with the exchange delivering late
    spread, single = eight(BASE), one(OURS)
    yield fig(
        "fleet.md",
        "Overall, against suffix spread: {}x without the exchange, {}x with it at once, {}x 8 calls late and"
        " {}x 64 calls late; against one server: {}, {}, {} and {}.",
        *((ratio(fleet(run), spread), F2) for run in FLEET_RUNS),
        *((ratio(fleet(run), single), F2) for run in FLEET_RUNS),
    )
    aider = [ratio(fleet(run, "aider"), one(OURS, "aider")) for run in FLEET_RUNS]
    yield fig(
        "fleet.md",
        "aider is the exception ({} of one server without the exchange, {} at once, {} at 64 calls late)",
        (aider[0], F2),
        (aider[1], F2),
        (aider[3], F2),
    )

    # fleet.md: the exchange's throughput, benchmarks/exchange_throughput.py
    catch_up = Get(EXCHANGE_THROUGHPUT, ("catch_up", "catch_up_s"))
    per_token = Get(EXCHANGE_THROUGHPUT, ("catch_up", "us_per_token"))
    steps = Calc(
        lambda s, budget: float(max(1, math.ceil(s / budget))),
        (catch_up, Get(EXCHANGE_THROUGHPUT, ("catch_up", "step_budget_s"))),
        "steps of the budget",
    )
    yield fig(
        "fleet.md",
        "Indexing a peer's output costs about {} µs per token (see [below](#is-redis-the-bottleneck)), so a catch-up"
        " of 2 048 outputs of 400 tokens done in one step would hold every request in the batch for {} s; spread out,"
        " it takes {} steps of 10 ms each.",
        (per_token, F1),
        (catch_up, F1),
        (steps, ".0f"),
    )
    eight_engines = Get(EXCHANGE_THROUGHPUT, ("engine", "outputs_per_s")).map(lambda o: o * 8, "eight engines")
    yield fig(
        "fleet.md",
        "on one core of a 2-core machine that other work kept busy (load average {}), measured:",
        (Get(EXCHANGE_THROUGHPUT, ("settings", "load_average", 0)), F1),
    )
    yield fig(
        "fleet.md",
        "`publish()` cost the engine {} µs per output in this run",
        (Get(EXCHANGE_THROUGHPUT, ("transport", "publish_call_us")), F1),
    )
    yield fig(
        "fleet.md",
        "indexing them into the global corpus took {} µs per token ({} outputs of {} tokens in {} ms), so the 10 ms"
        " step budget takes in about {} tokens, {} such outputs, per step. Eight engines like the one in the table"
        " finish about {} outputs per second between them",
        (per_token, F2),
        (Get(EXCHANGE_THROUGHPUT, ("settings", "catch_up")), ".0f"),
        (Get(EXCHANGE_THROUGHPUT, ("settings", "tokens")), ".0f"),
        (catch_up.map(lambda s: s * 1e3, "ms from s"), ",.0f"),
        (Get(EXCHANGE_THROUGHPUT, ("catch_up", "tokens_per_step")).map(lambda t: round(t, -2), "hundreds"), ",.0f"),
        (Get(EXCHANGE_THROUGHPUT, ("catch_up", "outputs_per_step")), ".0f"),
        (eight_engines, ".0f"),
    )
    yield fig(
        "fleet.md",
        "15 outputs of 400 tokens are {} KB/s",
        (eight_engines.map(lambda o: round(o) * 400 * 4 / 1e3, "KB/s of 4-byte tokens"), ".0f"),
    )

    # speed.md: the development set's tokens/s estimate, and the H200 step times (benchmarks/gpu_step_time.py)
    yield from speed_slice_figures()
    yield from speed_dev_figures()
    steps = Calc(lambda a, b: a + b, (Get(STEPS, ("rows",), count=True), Get(STEPS_70B, ("rows",), count=True)), "sum")
    yield fig("speed.md", "On one H200 (PyTorch 2.11, CUDA 13) it timed {} steps", (steps, ".0f"))
    copy = [Get(f, ("probe", "copy_bytes_per_s")) for f in (STEPS_70B, STEPS)]
    matmul = [Get(f, ("probe", "matmul_flops_per_s")) for f in (STEPS_70B, STEPS)]
    yield fig(
        "speed.md",
        "The GPU's probes gave {} to {} TB/s for a device copy ({}–{}% of the 4.8 TB/s datasheet figure) and {} to {}"
        " TFLOP/s for an 8192³ bf16 matrix product ({}–{}% of 989)",
        *((c.map(lambda b: b / 1e12, "TB/s"), F2) for c in copy),
        *((c.map(lambda b: b / 4.8e12 * 100, "% of 4.8 TB/s"), ".0f") for c in copy),
        *((m.map(lambda f: f / 1e12, "TFLOP/s"), ".0f") for m in matmul),
        *((m.map(lambda f: f / 989e12 * 100, "% of 989 TFLOP/s"), ".0f") for m in matmul),
    )
    yield fig(
        "speed.md",
        "the sum comes within {}% RMS of the measured steps; the maximum, at its best fit, within {}%, and it"
        " underestimates by up to {}%",
        (percent(Get(CALIBRATION, ("defaults", "rms"))), F1),
        (percent(Get(CALIBRATION, ("roofline_max", "rms"))), F1),
        (percent(Get(CALIBRATION, ("roofline_max", "largest"))), ".0f"),
    )
    for field in ("memory_efficiency", "kv_efficiency", "compute_efficiency"):
        yield fig("speed.md", f"| `{field}` | {{}} |", (Get(CALIBRATION, ("refit", "fields", field)), F2))
    yield fig(
        "speed.md",
        "| `layer_overhead_s` | {} µs |",
        (Get(CALIBRATION, ("refit", "fields", "layer_overhead_s")).map(lambda v: v * 1e6, "µs from s"), ".0f"),
    )
    yield fig(
        "speed.md",
        "while a plain device copy reached {}% of the datasheet bandwidth",
        (Get(STEPS, ("probe", "copy_bytes_per_s")).map(lambda b: b / 4.8e12 * 100, "% of 4.8 TB/s"), ".0f"),
    )


def index_cost(field: str, policy: dict[str, Any] | None = None) -> Get:
    """benchmarks/index_cost.py: the prompt side's ``field``, or with ``policy`` (overrides of
    DraftPolicy; ``{}``: the defaults) that policy's index time per call."""
    if policy is None:
        return Get(INDEX_COST, ("prompt_side", field))
    return Get(INDEX_COST, ("index_per_call", {"policy": policy}, field))


def index_cost_ratio(policy: dict[str, Any]) -> Get:
    """benchmarks/index_cost.py: vllm-suffix's index time per call over agentspec's, x in 1/x."""
    return index_cost("vllm_suffix_over_agentspec", policy)


def bench40(file: str, proposer: str, field: str) -> Get:
    """agentspec bench --limit 40: a field of one proposer's record over all sources."""
    return record(file, None, proposer, ALL, field)


def bench40_speed(file: str, concurrency: int) -> Calc:
    """agentspec bench --limit 40 --speed-model h100:8b: the model budget's tokens/s over vllm-suffix's."""
    rows = ("speed", 0, "rows")
    return ratio(
        Get(file, (*rows, {"name": "agentspec (model budget)"}, "tokens_per_s", str(concurrency))),
        Get(file, (*rows, {"name": BASE}, "tokens_per_s", str(concurrency))),
    )


def policy_measured_figures() -> Iterator[Figure]:
    """policy.md: the index's cost, the headroom of a choice made in hindsight, and longer drafts."""
    suffix_ms, ours_ms = (ms(index_cost(f, {})) for f in ("vllm_suffix_us_per_call", "agentspec_us_per_call"))
    new, prompt, per_token = index_cost("new"), index_cost("prompt"), index_cost("session_us_per_token")
    yield fig(
        "policy.md",
        "measured: {} of a call's {} prompt tokens are new to its session (1/{}), a new token costs {} µs in the"
        " session's depth-64 tree against {} µs in a fresh depth-24 tree over the prompt, and index time per call is {}"
        " ms against {} ms (1/{}). The new prompt text alone ({} tokens at {} µs, {} ms)",
        (new, ",.0f"),
        (prompt, ",.0f"),
        (ratio(prompt, new), ".0f"),
        (per_token, F2),
        (index_cost("fresh24_us_per_token"), F2),
        (ours_ms, F1),
        (suffix_ms, F1),
        (index_cost_ratio({}), F1),
        (new, ",.0f"),
        (per_token, F2),
        (Calc(lambda n, t: n * t / 1e3, (new, per_token), "ms of new tokens"), F1),
    )
    yield fig(
        "policy.md",
        "1/20 of suffix's {} ms per call in that run (`index_cost.py`, above) is {} ms, less than the {} ms its new"
        " prompt tokens alone took there",
        (suffix_ms, F1),
        (suffix_ms.map(lambda v: v / 20, "a 20th"), F2),
        (Calc(lambda n, t: n * t / 1e3, (new, per_token), "ms of new tokens"), F1),
    )
    yield fig(
        "policy.md",
        "measured on one core of a 2-core machine that other work kept busy, load average {}, so its times",
        (Get(INDEX_COST, ("settings", "load_average", 0)), F1),
    )
    gains = tuple(
        Get(HEADROOM, ("sources", source, "vs_agentspec", "hindsight-level")).map(lambda r: (r - 1) * 100, "gain %")
        for source in DEV_SOURCES
    )
    yield fig(
        "policy.md",
        "that choice: +{}% to +{}% AL by source)",
        (Calc(lambda *g: min(g), gains, "least"), ".0f"),
        (Calc(lambda *g: max(g), gains, "most"), ".0f"),
    )
    acceptance = [
        ratio(bench40(f, OURS, "acceptance_rate"), bench40(f, BASE, "acceptance_rate")) for f in (BENCH40, BENCH40_LONG)
    ]
    yield fig(
        "policy.md",
        "AL went from {}x to {}x, with acceptance from {} to {} of suffix's, and its estimated"
        " tokens/s under the model budget (H100, 8B) from {}x to {}x at concurrency 1 and from {}x to {}x at 64:",
        *((bench40(f, OURS, "al_vs_baseline"), F2) for f in (BENCH40, BENCH40_LONG)),
        *((a, F2) for a in acceptance),
        *((bench40_speed(f, 1), F2) for f in (BENCH40, BENCH40_LONG)),
        *((bench40_speed(f, 64), F2) for f in (BENCH40, BENCH40_LONG)),
    )


#: speed.md's speed models, as ``agentspec bench --speed-model`` names them: (GPU, model) in the JSON.
SPEED_MODELS = {
    "h100:8b": ("H100 SXM", "Llama-3-8B shape"),
    "h200:8b": ("H200", "Llama-3-8B shape"),
    "h100:70b": ("H100 SXM", "Llama-3-70B shape"),
}
CONCURRENCIES = (1, 8, 32, 64, 128)


def speed_table(model: str) -> tuple[Any, ...]:
    """The path of one speed model's table in a speed run (the development set's or the slice's)."""
    gpu, shape = SPEED_MODELS[model]
    return ("speed", {"gpu": gpu, "model": shape})


def tokens_per_s(model: str, row: str, concurrency: int, file: str = SPEED_DEV) -> Get:
    """Estimated tokens/s of one row (``no speculation``, ``vllm-suffix``, ``agentspec (fixed rule)``,
    ``agentspec (model budget)``) of a speed run (default: the development set's)."""
    return Get(file, (*speed_table(model), "rows", {"name": row}, "tokens_per_s", str(concurrency)))


def speed_dev(proposer: str, field: str) -> Get:
    """A field of the development set's speed run, one proposer over all sources."""
    return record(SPEED_DEV, None, proposer, ALL, field)


def budget_ratios(model: str, file: str) -> tuple[tuple[Value, str], ...]:
    """The model budget's tokens/s over vllm-suffix's at each concurrency, as the pages write them."""
    budget = "agentspec (model budget)"
    return tuple(
        (ratio(tokens_per_s(model, budget, c, file), tokens_per_s(model, BASE, c, file)), F2) for c in CONCURRENCIES
    )


def speed_slice_figures() -> Iterator[Figure]:
    """speed.md: the bundled slice replayed with three speed models."""

    def slice_record(proposer: str, field: str) -> Get:
        return record(SPEED_SLICE, None, proposer, ALL, field)

    h100_8b = speed_table("h100:8b")
    trajectories = tuple(Get(SPEED_SLICE, ("settings", "trajectories", s)) for s in DEV_SOURCES)
    yield fig(
        "speed.md",
        "(load average {} when it ended, so the drafter times are that load's;",
        (Get(SPEED_SLICE, (*h100_8b, "measured_on", "load_1m")), F1),
    )
    yield fig(
        "speed.md",
        "The run used the bundled slice: {} trajectories, {} calls, a mean context of {} tokens per step, replayed"
        " in {} s. AL was {} for vllm-suffix and {} for agentspec, and agentspec's acceptance rate was {} against {}.",
        (Calc(lambda *n: sum(n), trajectories, "sum"), ".0f"),
        (slice_record(OURS, "calls"), ",.0f"),
        (Get(SPEED_SLICE, (*h100_8b, "context_tokens")), ",.0f"),
        (Get(SPEED_SLICE, ("settings", "wall_s")), F1),
        (slice_record(BASE, "al"), F2),
        (slice_record(OURS, "al"), F2),
        (slice_record(OURS, "acceptance_rate"), F2),
        (slice_record(BASE, "acceptance_rate"), F2),
    )
    yield fig(
        "speed.md",
        "At c=128 the KV cache holds {} requests",
        (Get(SPEED_SLICE, (*h100_8b, "batch", "128")), ".0f"),
    )
    yield fig(
        "speed.md",
        "On the H200 with the 8B model, the model budget is {}×, {}×, {}×, {}× and {}×",
        *budget_ratios("h200:8b", SPEED_SLICE),
    )
    yield fig(
        "speed.md",
        "On the H100 with the 70B model (tensor parallel 4), it is {}×, {}×, {}×, {}× and {}×.",
        *budget_ratios("h100:70b", SPEED_SLICE),
    )


def speed_dev_figures() -> Iterator[Figure]:
    """speed.md: the development set replayed whole, and the tokens/s estimate made from it."""
    trajectories = Calc(
        lambda *n: sum(n), tuple(Get(SPEED_DEV, ("settings", "trajectories", s)) for s in DEV_SOURCES), "sum"
    )
    yield fig(
        "speed.md",
        "{} trajectories, {} calls, a mean context of {} tokens, replayed in {} s",
        (trajectories, ",.0f"),
        (speed_dev(OURS, "calls"), ",.0f"),
        (Get(SPEED_DEV, (*speed_table("h100:8b"), "context_tokens")), ",.0f"),
        (Get(SPEED_DEV, ("settings", "wall_s")), ".0f"),
    )
    yield fig(
        "speed.md",
        "AL was {} for vllm-suffix and {} for agentspec, with acceptance rates of {} and {}; proposing took {} µs per"
        " request-step for vllm-suffix and {} µs for agentspec.",
        (speed_dev(BASE, "al"), F2),
        (speed_dev(OURS, "al"), F2),
        (speed_dev(BASE, "acceptance_rate"), F2),
        (speed_dev(OURS, "acceptance_rate"), F2),
        (speed_dev(BASE, "propose_us_per_step"), ".0f"),
        (speed_dev(OURS, "propose_us_per_step"), ".0f"),
    )
    yield fig(
        "speed.md",
        "that other work kept busy (load average {} when it ended)",
        (Get(SPEED_DEV, (*speed_table("h100:8b"), "measured_on", "load_1m")), F1),
    )
    yield fig(
        "speed.md",
        "On the H100 with the 8B model, the KV cache holds {} requests",
        (Get(SPEED_DEV, (*speed_table("h100:8b"), "batch", "128")), ".0f"),
    )
    budget = "agentspec (model budget)"
    for model, words in (
        ("h100:8b", "H100 with the 8B model"),
        ("h200:8b", "H200 with the 8B model"),
        ("h100:70b", "H100 with the 70B model (tensor parallel 4)"),
    ):
        yield fig(
            "speed.md",
            f"- {words}: " + ", ".join(["{}×"] * len(CONCURRENCIES)),
            *((ratio(tokens_per_s(model, budget, c), tokens_per_s(model, BASE, c)), F2) for c in CONCURRENCIES),
        )
    yield fig(
        "speed.md",
        "speculation beats no speculation everywhere ({}× at c=128 with the 8B on the H100, on the development set)",
        (ratio(tokens_per_s("h100:8b", BASE, 128), tokens_per_s("h100:8b", "no speculation", 128)), F1),
    )
    ahead = tuple(
        ratio(tokens_per_s(m, budget, c), tokens_per_s(m, BASE, c)).map(lambda r: (r - 1) * 100, "% ahead")
        for m in ("h100:8b", "h200:8b")
        for c in (64, 128)
    )
    yield fig(
        "speed.md",
        "at 64 requests and more agentspec stays only {} to {}% ahead of vLLM's suffix method (8B)",
        (Calc(lambda *a: min(a), ahead, "least"), ".0f"),
        (Calc(lambda *a: max(a), ahead, "most"), ".0f"),
    )
    yield fig(
        "speed.md",
        "Its drafts are longer and less often accepted ({} against {})",
        (speed_dev(OURS, "acceptance_rate"), F2),
        (speed_dev(BASE, "acceptance_rate"), F2),
    )


#: The development set's sources, in the file's order.
DEV_SOURCES = (
    "mini_swe_agent",
    "swe_agent",
    "tau_bench",
    "openhands_mocks",
    "aider",
    "reflexion_hotpotqa_react",
    "reflexion_programming",
    "tot",
    "codet",
)

#: The rows of speed.md's table of measured steps, (context, batch, verified) per shape, and how it names the shape.
SPEED_ROWS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "8b": ((8192, 1, 1), (8192, 1, 16), (8192, 8, 16), (8192, 32, 1), (8192, 32, 16), (8192, 64, 1), (8192, 64, 16)),
    "32b": ((2048, 1, 1), (2048, 32, 16), (2048, 128, 16)),
    "70b-40l": ((8192, 1, 1), (8192, 32, 16)),
}
SHAPE_NAMES = {"8b": "8B", "32b": "32B", "70b-40l": "70B, 40 layers"}


# ---------------------------------------------------------------------------- tables


def _rec(results: Results, file: str, run: str | None, proposer: str, source: str) -> dict[str, Any]:
    data = results.json(file)
    data = data[run] if run else data
    for r in data["records"]:
        if r["proposer"] == proposer and r["source"] == source:
            return r
    raise LookupError(f"{file}: {run or ''} has no record of {proposer} on {source}")


def _row(cells: list[str], bold: bool = False) -> str:
    return "| " + " | ".join(f"**{c}**" if bold and c else c for c in cells) + " |"


def _header(*columns: str) -> list[str]:
    return [_row(list(columns)), "|" + "---|" * len(columns)]


#: Results recorded while the replay's and the live benchmark's ``vllm-suffix`` was vLLM 0.32's
#: suffix tree (the proposer named ``vllm-suffix-0.32`` since ``vllm-suffix`` models 0.34's method).
SUFFIX_TREE_ERA = frozenset(
    {
        BENCH40_LONG,
        BENCH40,
        HEADROOM,
        CHOOSER,
        LOCKSTEP,
        WINDOW,
        WINDOW_SEEDED,
        SWEEP,
        TARGETS,
        RL_EPOCHS,
        RL_ROUTING_60_EXCHANGE,
        RL_ROUTING_60,
        RL_ROUTING,
        SPEED_DEV,
        LIVE_DRAFTER,
        LIVE,
        REPLAY_DRAFTER,
        RL_LIVE_QUEUED,
        RL_LIVE,
        SPEED_SLICE,
    }
)


def _from(*files: str) -> str:
    made = "; ".join(f"`benchmarks/results/{f}`, written by `{COMMANDS[f]}`" for f in files)
    era = ""
    if any(f in SUFFIX_TREE_ERA for f in files):
        era = " There `vllm-suffix` is vLLM 0.32's suffix tree (today's `vllm-suffix-0.32`)."
    return f"\n*Made from {made}.{era}*"


def table_dev_set(results: Results) -> str:
    """docs/data.md: the development set's sources, trajectories and calls."""
    counts = results.json(TARGETS)["one_server"]["settings"]["trajectories"]
    lines = _header("source", "trajectories", "calls")
    for source in sources(results, TARGETS, "one_server"):
        calls = _rec(results, TARGETS, "one_server", OURS, source)["calls"]
        n = sum(counts.values()) if source == ALL else counts[source]
        lines.append(_row([source if source != ALL else "all", f"{n:,}", f"{calls:,}"], bold=source == ALL))
    return "\n".join(lines) + "\n" + _from(TARGETS)


def table_dev_one_server(results: Results) -> str:
    """docs/policy.md: AL and acceptance on one server, agentspec / vllm-suffix."""
    lines = _header("source", "calls", "AL suffix", "AL agentspec", "AL ratio", "acceptance ratio")
    for source in sources(results, TARGETS, "one_server"):
        b, o = (_rec(results, TARGETS, "one_server", p, source) for p in (BASE, OURS))
        ratio_cell = f"{o['al'] / b['al']:.3f}"
        lines.append(
            _row(
                [
                    source,
                    f"{o['calls']:,}",
                    f"{b['al']:.3f}",
                    f"{o['al']:.3f}",
                    f"**{ratio_cell}**" if source == ALL else ratio_cell,
                    f"{o['acceptance_rate'] / b['acceptance_rate']:.3f}",
                ]
            )
        )
    return "\n".join(lines) + "\n" + _from(TARGETS)


def table_dev_eight_replicas(results: Results) -> str:
    """docs/policy.md: 8 replicas, agentspec on its own (a) and exchanging outputs (b)."""
    lines = _header(
        "source",
        "AL suffix",
        "AL agentspec (a)",
        "ratio (a)",
        "AL agentspec (b)",
        "ratio (b)",
        "acceptance ratio (b)",
    )
    for source in sources(results, TARGETS, "eight_replicas"):
        b = _rec(results, TARGETS, "eight_replicas", BASE, source)
        a = _rec(results, TARGETS, "eight_replicas", OURS, source)
        sb = _rec(results, TARGETS, "eight_replicas_exchanging", BASE, source)
        s = _rec(results, TARGETS, "eight_replicas_exchanging", OURS, source)
        ra, rs = f"{a['al'] / b['al']:.3f}", f"{s['al'] / sb['al']:.3f}"
        bold = source == ALL
        lines.append(
            _row(
                [
                    source,
                    f"{b['al']:.3f}",
                    f"{a['al']:.3f}",
                    f"**{ra}**" if bold else ra,
                    f"{s['al']:.3f}",
                    f"**{rs}**" if bold else rs,
                    f"{s['acceptance_rate'] / sb['acceptance_rate']:.3f}",
                ]
            )
        )
    return "\n".join(lines) + "\n" + _from(TARGETS)


def table_dev_next_targets(results: Results) -> str:
    """docs/policy.md: the closer-to-the-oracle targets, measured."""
    every = min(
        _rec(results, TARGETS, "one_server", OURS, s)["al_vs_baseline"] for s in sources(results, TARGETS, "one_server")
    )
    index = index_fraction()(results)
    memory = peak_ratio("mini_swe_agent")(results)
    rows = [
        ("AL, one server, overall >= 1.25x", one(OURS, field="al_vs_baseline")(results), 1.25),
        ("AL, one server, every source >= 1.05x", every, 1.05),
        ("acceptance, one server, >= 0.85 of suffix's", acceptance_ratio()(results), 0.85),
        ("AL, 8 replicas exchanging, >= 1.45x", exchanging(OURS, field="al_vs_baseline")(results), 1.45),
    ]
    lines = _header("target", "measured", "met")
    lines += [_row([name, f"{value:.3f}", "yes" if value >= bound else "no"]) for name, value, bound in rows]
    lines.append(
        _row(
            [
                "index time per call on mini_swe_agent <= 1/20 of suffix's",
                f"1/{index:.1f}",
                "yes" if index >= 20 else "no",
            ]
        )
    )
    lines.append(
        _row(["peak index memory on mini_swe_agent <= 2x suffix's", f"{memory:.2f}x", "yes" if memory <= 2 else "no"])
    )
    return "\n".join(lines) + "\n" + _from(TARGETS)


def table_dev_memory(results: Results) -> str:
    """docs/tuning.md: peak index memory per source on one server, largest first."""
    rows = []
    for source in sources(results, TARGETS, "one_server"):
        if source == ALL:
            continue
        b, o = (_rec(results, TARGETS, "one_server", p, source) for p in (BASE, OURS))
        rows.append((o["peak_index_mb"], source, o, b))
    lines = _header("source", "agentspec peak", "bytes per token", "vllm-suffix peak", "bytes per token", "ratio")
    for _, source, o, b in sorted(rows, key=lambda row: -row[0]):
        lines.append(
            _row(
                [
                    source,
                    f"{o['peak_index_mb']:,.0f} MB",
                    f"{o['bytes_per_held_token']:.0f}",
                    f"{b['peak_index_mb']:,.0f} MB",
                    f"{b['bytes_per_held_token']:.0f}",
                    f"{o['peak_index_mb'] / b['peak_index_mb']:.2f}×",
                ]
            )
        )
    return "\n".join(lines) + "\n" + _from(TARGETS)


def table_dev_loops(results: Results) -> str:
    """docs/bench.md: the default loop and --lockstep on one server."""
    lines = _header(
        "source",
        "vllm-suffix",
        "agentspec",
        "ratio",
        "vllm-suffix, lockstep",
        "agentspec, lockstep",
        "ratio, lockstep",
    )
    for source in sources(results, TARGETS, "one_server"):
        b, o = (_rec(results, TARGETS, "one_server", p, source) for p in (BASE, OURS))
        lb, lo = (_rec(results, LOCKSTEP, None, p, source) for p in (BASE, OURS))
        r, lr = f"{o['al'] / b['al']:.3f}", f"{lo['al'] / lb['al']:.3f}"
        bold = source == ALL
        lines.append(
            _row(
                [
                    source,
                    f"{b['al']:.3f}",
                    f"{o['al']:.3f}",
                    f"**{r}**" if bold else r,
                    f"{lb['al']:.3f}",
                    f"{lo['al']:.3f}",
                    f"**{lr}**" if bold else lr,
                ]
            )
        )
    return "\n".join(lines) + "\n" + _from(TARGETS, LOCKSTEP)


def table_dev_exchange_lag(results: Results) -> str:
    """docs/fleet.md: AL on 8 replicas with the exchange delivering late."""
    lines = _header("source", "one server", "suffix spread", "no exchange", "lag 0", "lag 8", "lag 64")
    for source in sources(results, TARGETS, "eight_replicas"):
        cells = [
            one(OURS, source)(results),
            eight(BASE, source)(results),
            *(fleet(run, source)(results) for run in FLEET_RUNS),
        ]
        lines.append(_row([source, *(f"{al:.3f}" for al in cells)], bold=source == ALL))
    return "\n".join(lines) + "\n" + _from(TARGETS, LAG8, LAG64)


#: Table name (the marker's) -> what makes it from the results.
#: The live benchmark's workloads as the README's table names them.
LIVE_WORKLOADS = {"dev": "recorded agent conversations", "loop": "repair loops on the model's own answers"}


def live(workload: str, server: str, field: str, at: int = 0) -> Get:
    """benchmarks/live_bench.py: a median (``at=0``), minimum (1) or maximum (2) over runs."""
    return Get(LIVE, ("summary", workload, server, field, at))


def table_speed(results: Results, file: str) -> str:
    """docs/speed.md: estimated tokens/s of a speed run (``file``), H100 with the 8B model, with
    each cell's ratio to vllm-suffix, draft cap and probability cut."""
    data = results.json(file)
    gpu, shape = SPEED_MODELS["h100:8b"]
    (table,) = [t for t in data["speed"] if (t["gpu"], t["model"]) == (gpu, shape)]
    rows = {row["name"]: row for row in table["rows"]}
    lines = _header("proposer", *(f"c={c}" for c in CONCURRENCIES))
    for name, label in (
        ("no speculation", "no speculation"),
        (BASE, BASE),
        ("agentspec (fixed rule)", "agentspec, fixed rule"),
        ("agentspec (model budget)", "agentspec, model budget"),
    ):
        row, cells = rows[name], []
        for i, c in enumerate(CONCURRENCIES):
            speed = row["tokens_per_s"][str(c)]
            cell = f"{speed:,.0f}"
            if name not in ("no speculation", BASE):
                cap = row["caps"][str(c)]
                notes = [f"{speed / rows[BASE]['tokens_per_s'][str(c)]:.2f}×", f"k={cap}" if i == 0 else f"{cap}"]
                if str(c) in row["min_probs"]:
                    notes.append(f"p≥{row['min_probs'][str(c)]:g}")
                cell += f" ({', '.join(notes)})"
            cells.append(cell)
        lines.append(_row([label, *cells]))
    on = table.get("measured_on")
    where = ""
    if on:
        where = (
            f" Drafter times measured at a load average of {on['load_1m']:.1f} (1 min) / {on['load_5m']:.1f} (5 min),"
            f" the replay on {on['cpus']} CPU{'s' if on['cpus'] != 1 else ''}"
            + (": a busy machine, so they are inflated." if on.get("busy") else ".")
        )
    return (
        "\n".join(lines)
        + "\n\n*Estimated tokens/s (ratio to vllm-suffix, draft cap, probability cut)."
        + where
        + "*\n"
        + _from(file)
    )


def table_dev_speed(results: Results) -> str:
    """docs/speed.md: the development set's estimate (:func:`table_speed`)."""
    return table_speed(results, SPEED_DEV)


def table_slice_speed(results: Results) -> str:
    """docs/speed.md: the bundled slice's estimate (:func:`table_speed`)."""
    return table_speed(results, SPEED_SLICE)


def table_window_seeding(results: Results) -> str:
    """docs/bench.md: openhands_mocks's AL with whole prompts (the one-server replay), a
    1024-token window, and that window with condenser seeding."""
    lines = _header("prompts", "vllm-suffix AL", "agentspec AL", "agentspec / suffix")
    for label, file, run in (
        ("whole", TARGETS, "one_server"),
        ("window 1024", WINDOW, None),
        ("window 1024, condenser seeding", WINDOW_SEEDED, None),
    ):
        source = "openhands_mocks"
        base, ours = (_rec(results, file, run, p, source) for p in (BASE, OURS))
        lines.append(_row([label, f"{base['al']:.3f}", f"{ours['al']:.3f}", f"{ours['al_vs_baseline']:.3f}×"]))
    return "\n".join(lines) + "\n" + _from(TARGETS, WINDOW, WINDOW_SEEDED)


def table_calibration(results: Results) -> str:
    """docs/speed.md: the speed model's RMS and largest error on the H200's steps, with its
    defaults, refitted without one model shape or one context, and as the textbook roofline."""
    data = results.json(CALIBRATION)

    def pct(v: float) -> str:
        return f"{v * 100:.1f}%"

    def spread(kind: str) -> list[str]:
        held = [h for h in data["held_out"] if h["kind"] == kind]
        low, high = min(h["rms"] for h in held), max(h["rms"] for h in held)
        return [f"{low * 100:.1f}–{pct(high)}", pct(max(h["largest"] for h in held))]

    lines = _header("", "RMS error", "largest error")
    d, r = data["defaults"], data["roofline_max"]
    lines.append(_row(["the model with its defaults (the fit of these steps)", pct(d["rms"]), pct(d["largest"])]))
    lines.append(_row(["fitted without one model shape, judged on it", *spread("model")]))
    lines.append(_row(["fitted without one context, judged on it", *spread("context")]))
    lines.append(_row(["textbook roofline (`max`, per-layer cost), at its best fit", pct(r["rms"]), pct(r["largest"])]))
    return "\n".join(lines) + "\n" + _from(CALIBRATION)


def table_calibration_rows(results: Results) -> str:
    """docs/speed.md: some of the H200's steps, measured against the speed model's estimate
    (the calibration must be of the step times committed beside it)."""
    data = results.json(CALIBRATION)

    def error(e: float) -> str:
        points = round(e * 100)
        return "0%" if points == 0 else f"{points:+d}%".replace("-", "−")

    lines = _header("model", "context", "batch", "verified", "measured ms", "model ms", "error")
    for shape, rows in SPEED_ROWS.items():
        for context, batch, verified in rows:
            (row,) = [
                r
                for r in data["rows"]
                if (r["model"], r["context"], r["batch"], r["verified"]) == (shape, context, batch, verified)
            ]
            timed = step_ms(STEPS_70B if shape == "70b-40l" else STEPS, shape, context, batch, verified)(results)
            if abs(row["measured_s"] * 1e3 - timed) > 1e-9:
                raise ValueError(
                    f"{CALIBRATION} is not of the steps timed now ({shape}, {context}, {batch}, {verified})"
                )
            cells = [f"{row['measured_s'] * 1e3:.1f}", f"{row['estimate_s'] * 1e3:.1f}", error(row["error"])]
            lines.append(_row([SHAPE_NAMES[shape], f"{context:,}", f"{batch}", f"{verified}", *cells]))
    return "\n".join(lines) + "\n" + _from(CALIBRATION)


def table_exchange_throughput(results: Results) -> str:
    """docs/fleet.md: outputs per second through the Redis exchange, against an engine's."""
    data = results.json(EXCHANGE_THROUGHPUT)
    t, e = data["transport"], data["engine"]
    lines = _header("", "outputs/s")
    lines.append(_row(["sent by one replica", f"{t['sent_per_s']:,.0f}"]))
    lines.append(_row([f"read by each of {data['settings']['peers']} replicas", f"{t['read_per_s']:,.0f}"]))
    engine = (
        f"one engine finishes (speed model: 8B on an H100, {e['concurrency']} requests in flight,"
        f" {e['context'] // 1000}k context)"
    )
    lines.append(_row([engine, f"{e['outputs_per_s']:.1f}"]))
    return "\n".join(lines) + "\n" + _from(EXCHANGE_THROUGHPUT)


def table_live(results: Results, file: str = LIVE) -> str:
    """docs/bench.md: tokens/s, AL and acceptance per server and workload on the real model."""
    data = results.json(file)
    lines = _header(
        "workload", "server", "tokens/s", "vs vllm-suffix", "vs none", "AL", "acceptance", "replay AL", "steps = server"
    )

    def cell(value: Any, spec: str) -> str:
        if value is None:
            return "-"
        median, low, high = value
        return f"{median:{spec}} ({low:{spec}}-{high:{spec}})"

    for workload, servers in data["summary"].items():
        for server, row in servers.items():
            exact = row.get("steps_equal_server")
            lines.append(
                _row(
                    [
                        workload,
                        server,
                        cell(row["tokens_per_s"], ".1f"),
                        cell(row["vs_vllm_suffix"], ".2f"),
                        cell(row["vs_none"], ".2f"),
                        cell(row["al"], ".2f"),
                        cell(row["acceptance"], ".3f") if server != "none" else "-",
                        cell(row["replay_al"], ".2f"),
                        "-" if exact is None else ("yes" if exact else "no"),
                    ]
                )
            )
    size = {w: next(iter(s.values())) for w, s in data["summary"].items()}
    sizes = "; ".join(f"{w}: {r['calls']} calls, {r['output_tokens']:,} output tokens" for w, r in size.items())
    note = (
        f"\n*Median (min-max) of {next(iter(size.values()))['runs']} runs on {data['cpus']} CPU cores, one server at"
        f" a time; per server and run, {sizes}.*"
    )
    return "\n".join(lines) + "\n" + note + _from(file)


def table_rl_live(results: Results, file: str = RL_LIVE) -> str:
    """docs/rl.md: GRPO groups live on two engines, pinned vs spread, and (where the run
    had them) epoch 2 after a real policy update with the old outputs kept or retired."""
    data = results.json(file)

    def cell(value: list[float], spec: str) -> str:
        median, low, high = value
        return f"{median:{spec}} ({low:{spec}}-{high:{spec}})"

    summary, settings = data["summary"], data["settings"]
    lines = _header("routing arm", "tokens/s", "AL", "tokens/s vs agentspec spread", "tokens/s vs vllm-suffix pinned")
    for arm, row in summary["routing"].items():
        cells = [cell(row["tokens_per_s"], ".1f"), cell(row["al"], ".2f"), cell(row["over_spread"], ".2f")]
        lines.append(_row([arm, *cells, cell(row["over_suffix"], ".2f")]))
    groups = f"{settings['tasks']} groups of {settings['samples']} samples of at most {settings['max_tokens']} tokens"
    note = (
        f"\n*Median (min-max) of {settings['runs']} runs on {data['cpus']} CPU cores, two engines at once, each on a"
        f" core of its own, {settings['concurrency']} calls in flight on each; {groups} at temperature 1."
    )
    if epochs := summary.get("epochs"):
        columns = ("epoch 2, old outputs", "tokens/s", "AL", "epoch 1 AL", "tokens/s vs retired", "AL vs retired")
        lines += ["", *_header(*columns)]
        for arm, row in epochs["arms"].items():
            cells = [cell(row[k], spec) for k, spec in (("tokens_per_s", ".1f"), ("al", ".2f"), ("epoch1_al", ".2f"))]
            lines.append(_row([arm, *cells, cell(row["over_retired"], ".2f"), cell(row["al_over_retired"], ".2f")]))
        note += (
            f" The update: {settings['update_steps']} AdamW steps at learning rate {settings['lr']:g}, moving the"
            f" trained samples' mean log-probability per token by {cell(epochs['logp_shift'], '.3f')} nats."
        )
    return "\n".join(lines) + "\n" + note + "*" + _from(file)


def trained(field: str, *rest: Any, head: str = "trained") -> Get:
    """agentspec train-drafter's held-out score of the ``trained`` (or ``untrained``) head."""
    return Get(DRAFTER_TRAIN, ("result", head, field, *rest))


def table_drafter_train(results: Results) -> str:
    """docs/drafter.md: the held-out score of the head before and after training."""
    data = results.json(DRAFTER_TRAIN)
    r = data["result"]
    lines = _header(
        "head", "pass 1", "pass 2", "pass 3", "pass 1, the index's hard steps", "accepted per 3-draft chain"
    )
    for name in ("untrained", "trained"):
        score = r[name]
        lines.append(
            _row(
                [name, *(f"{a:.3f}" for a in score["acceptance"]), f"{score['hard_acceptance']:.3f}",
                 f"{score['chain_accepted']:.3f}"]
            )
        )  # fmt: skip
    held = r["untrained"]
    note = (
        f"\n*Held out: {r['held_out_examples']} calls, {held['tokens']:,} output tokens ({held['hard_tokens']:,} on the"
        f" index's hard steps). Trained on {r['train_examples']} calls ({r['output_tokens']:,} output tokens,"
        f" {r['hard_tokens']:,} of them on hard steps) for {r['steps']} steps in {data['wall_s'] / 60:.0f} min on"
        f" {data['cpus']} CPU cores, {data['note']}.*"
    )
    return "\n".join(lines) + "\n" + note + _from(DRAFTER_TRAIN)


def live_drafter(workload: str, server: str, field: str) -> Get:
    """benchmarks/live_bench.py with the trained head (one run: the median is the run)."""
    return Get(LIVE_DRAFTER, ("summary", workload, server, field, 0))


def table_live_drafter(results: Results) -> str:
    """docs/drafter.md: the hybrid with a trained head, live on the real model."""
    data = results.json(LIVE_DRAFTER)
    lines = _header(
        "workload", "server", "tokens/s", "vs vllm-suffix", "vs none", "AL", "acceptance", "drafter's share",
        "passes skipped",
    )  # fmt: skip

    def cell(value: Any, spec: str) -> str:
        return "-" if value is None else f"{value[0]:{spec}}"

    for workload, servers in data["summary"].items():
        for server, row in servers.items():
            lines.append(
                _row(
                    [workload, server, cell(row["tokens_per_s"], ".1f"), cell(row["vs_vllm_suffix"], ".2f"),
                     cell(row["vs_none"], ".2f"), cell(row["al"], ".2f"),
                     cell(row["acceptance"], ".3f") if server != "none" else "-",
                     cell(row.get("model_share_recovered"), ".3f"), cell(row.get("drafter_skip_share"), ".3f")]
                )
            )  # fmt: skip
    size = {w: next(iter(s.values())) for w, s in data["summary"].items()}
    sizes = "; ".join(f"{w}: {r['calls']} calls, {r['output_tokens']:,} output tokens" for w, r in size.items())
    note = f"\n*One run on {data['cpus']} CPU cores, one server at a time; per server, {sizes}.*"
    return "\n".join(lines) + "\n" + note + _from(LIVE_DRAFTER)


#: The replay with a trained head: its proposers in the order the table shows them.
REPLAY_DRAFTER_PROPOSERS = (
    "none",
    "vllm-suffix",
    "drafter",
    "agentspec",
    "agentspec-hybrid-arctic",
    "agentspec-hybrid",
)


def table_replay_drafter(results: Results) -> str:
    """docs/drafter.md: agentspec bench --drafter on the real model's own answers."""
    data = results.json(REPLAY_DRAFTER)
    by = {(r["proposer"], r["source"]): r for r in data["records"]}
    lines = _header(
        "workload", "proposer", "AL", "vs index alone", "acceptance", "model drafts", "passes skipped",
        "share recovered",
    )  # fmt: skip
    for source in [*data["settings"]["trajectories"], ALL]:
        index = by[(OURS, source)]["al"]
        for proposer in REPLAY_DRAFTER_PROPOSERS:
            r = by[(proposer, source)]
            c = r.get("counters") or {}
            steps = c.get("drafter_runs", 0) + c.get("drafter_runs_skipped", 0)
            lines.append(
                _row(
                    [source.removeprefix("live-"), proposer, f"{r['al']:.2f}", f"{r['al'] / index:.2f}",
                     f"{r['acceptance_rate']:.3f}" if proposer != "none" else "-",
                     f"{c['model_drafts']:,}" if c else "-",
                     f"{c['drafter_runs_skipped'] / steps:.3f}" if c else "-",
                     f"{c['hard_step_model_accepted_tokens'] / c['hard_step_tokens']:.3f}" if c else "-"]
                )
            )  # fmt: skip
    counts = data["settings"]["trajectories"]
    sizes = "; ".join(
        f"{source.removeprefix('live-')}: {n} sessions, {by[('none', source)]['calls']} calls,"
        f" {by[('none', source)]['output_tokens']:,} output tokens"
        for source, n in counts.items()
    )
    note = (
        f"\n*The real model's own greedy answers, replayed ({sizes}); the head drafts"
        f" {data['settings']['proposer_settings']['drafter']['tokens']} tokens. Passes skipped: the steps on which no"
        " model draft was sent; share recovered: model-accepted tokens over the tokens decoded on the steps where the"
        " index expected fewer than 2.*"
    )
    return "\n".join(lines) + "\n" + note + _from(REPLAY_DRAFTER)


def drafter_pass(name: str) -> Get:
    """benchmarks/drafter_cost.py: one pass's cost over the target's step."""
    return Get(DRAFTER_COST, ("rows", {"pass": name}, "vs_target_step"))


def table_drafter_cost(results: Results) -> str:
    """docs/engine.md: one pass of each candidate drafter beside the target's step."""
    data = results.json(DRAFTER_COST)
    lines = _header("pass", "ms", "of a target step")
    for row in data["rows"]:
        lines.append(_row([row["pass"], f"{row['seconds'] * 1000:.2f}", f"{row['vs_target_step']:.3f}"]))
    return "\n".join(lines) + "\n" + _from(DRAFTER_COST)


#: The hybrid share's thresholds T as its JSON keys them (benchmarks/hybrid_share.py).
SHARE_THRESHOLDS = ("1.0", "2.0", "4.0")


def share(source: str, field: str, threshold: str | None = None) -> Get:
    """benchmarks/hybrid_share.py: a field of one source's counts (``all``: every source), or
    its value at ``threshold`` for the fields kept per threshold."""
    return Get(HYBRID_SHARE, (source, field) if threshold is None else (source, field, threshold))


def accepted_between(low: str, high: str, source: str = ALL) -> Calc:
    """Draft tokens the index's drafts had accepted per step on the steps whose draft was
    expected to deliver from ``low`` up to ``high`` tokens (steps below ``high`` less those
    below ``low``; no-draft steps are below both)."""
    steps = [share(source, "below_steps", t) for t in (low, high)]
    accepted = [share(source, "below_accepted", t) for t in (low, high)]
    return Calc(lambda s0, s1, a0, a1: (a1 - a0) / (s1 - s0), (*steps, *accepted), "accepted per step between")


def table_hybrid_share(results: Results) -> str:
    """docs/engine.md: the steps without a confident index draft, per source and over all."""
    data = results.json(HYBRID_SHARE)
    thresholds = " | ".join(f"E<{float(t):g}" for t in SHARE_THRESHOLDS)
    lines = _header("source", "steps", "no draft", *thresholds.split(" | "), "tokens on E<2 steps")
    lines[1] = "|---|" + "---:|" * (len(SHARE_THRESHOLDS) + 3)
    for source, c in data.items():
        cells = [
            "all sources" if source == ALL else source,
            f"{c['steps']:,}",
            f"{c['no_draft_step_share']:.1%}",
            *(f"{c['below_step_share'][t]:.1%}" for t in SHARE_THRESHOLDS),
            f"{c['below_token_share']['2.0']:.1%}",
        ]
        lines.append(_row(cells, bold=source == ALL))
    return "\n".join(lines) + "\n" + _from(HYBRID_SHARE)


def swept(policy: dict[str, Any], field: str = "al_ratio", source: str = ALL) -> Get:
    """benchmarks/policy_sweep.py: agentspec / vllm-suffix under ``policy`` (its overrides of
    DraftPolicy; ``{}``: the defaults), ``field`` = ``al_ratio`` or ``acceptance_ratio``."""
    return Get(SWEEP, ("policies", {"policy": policy}, field, source))


#: How the sweep table names a policy's knobs (in this order), and the short column names.
_KNOBS = {
    "calibrate_levels": lambda v: "calibrated" if v else "not calibrated",
    "max_depth": lambda v: f"depth {v}",
    "max_match_tokens": lambda v: f"match {v}",
    "max_spec_factor": lambda v: f"factor {v}",
    "min_token_prob": lambda v: f"min prob {v}",
}
_SHORT = {"openhands_mocks": "openhands", "mini_swe_agent": "mini_swe"}
#: Notes on rows, by the policy's overrides.
_NOTES = {json.dumps({"calibrate_levels": False, "min_token_prob": 0.3}): "the earlier defaults"}


def _policy_label(policy: dict[str, Any], defaults: dict[str, Any]) -> str:
    if not policy:
        knobs = ("max_spec_factor", "min_token_prob", "calibrate_levels")
        return "defaults (" + ", ".join(_KNOBS[k](defaults[k]) for k in knobs) + ")"
    label = ", ".join(_KNOBS[k](policy[k]) for k in _KNOBS if k in policy)
    note = _NOTES.get(json.dumps(policy))
    return f"{label} ({note})" if note else label


def table_policy_sweep(results: Results) -> str:
    """docs/policy.md: agentspec / vllm-suffix under each draft policy of the sweep."""
    data = results.json(SWEEP)
    names = data["settings"]["sources"]
    lines = _header(
        "policy", "AL ratio (all)", "lowest AL ratio", *(f"acc {_SHORT.get(s, s)}" for s in names), "acc all"
    )
    for row in data["policies"]:
        acc = row["acceptance_ratio"]
        cells = [
            _policy_label(row["policy"], data["settings"]["defaults"]),
            f"{row['al_ratio'][ALL]:.3f}",
            f"{row['lowest_al_ratio']:.3f}",
            *(f"{acc[s]:.2f}" for s in [*names, ALL]),
        ]
        lines.append(_row(cells, bold=not row["policy"]))
    return "\n".join(lines) + "\n" + _from(SWEEP)


def chooser(*path: str) -> Get:
    """benchmarks/chooser_fit.py: a figure of the fit, e.g. ``chooser("held", "log_loss")``."""
    return Get(CHOOSER, path)


def chosen_over_calibrated(choice: str) -> Calc:
    """Accepted tokens on the held steps choosing by ``choice``, over the calibrated score's."""
    return ratio(chooser("held", "accepted", choice), chooser("held", "accepted", "calibrated_score"))


def held_vs_suffix(proposer: str, field: str = "al") -> Calc:
    """``agentspec`` or ``agentspec-fitted`` on the held half, over vllm-suffix's."""
    return ratio(chooser("replay", ALL, proposer, field), chooser("replay", ALL, BASE, field))


def table_chooser_fit(results: Results) -> str:
    """docs/policy.md: accepted tokens on the held steps by the calibrated score, the fitted
    chooser and in hindsight."""
    lines = _header("on the held steps, same candidates", "accepted tokens", "vs the calibrated score")
    for choice, what in (
        ("calibrated_score", "calibrated score (the index's rule)"),
        ("fitted_model", "fitted survival model"),
        ("hindsight", "hindsight: the candidate the recorded output accepts furthest"),
    ):
        accepted = chooser("held", "accepted", choice)(results)
        lines.append(_row([what, f"{accepted:,.0f}", f"{chosen_over_calibrated(choice)(results):.3f}"]))
    return "\n".join(lines) + "\n" + _from(CHOOSER)


def rl_al(file: str, source: str, arm: str) -> Get:
    """benchmarks/rl_routing.py: one arm's AL (``agentspec, client``, ``vllm-suffix, spread``...)."""
    return Get(file, ("sources", source, "al", arm))


def rl_pinning(file: str, source: str, proposer: str = "agentspec") -> Calc:
    """benchmarks/rl_routing.py: AL pinned by the rollout client over AL spread."""
    return ratio(rl_al(file, source, f"{proposer}, client"), rl_al(file, source, f"{proposer}, spread"))


def table_rl_routing(results: Results) -> str:
    """docs/rl.md: AL of codet's and tot's groups on 8 replicas, pinned and spread: the first
    60 groups of each, then all."""
    lines = _header(
        "source",
        "groups",
        "agentspec pinned",
        "agentspec spread",
        "pinned / spread",
        "vLLM suffix pinned",
        "vLLM suffix spread",
        "pinned / spread",
    )
    for file in (RL_ROUTING_60, RL_ROUTING):
        data = results.json(file)
        limit = data["settings"]["limit"]
        for source, row in data["sources"].items():
            al = row["al"]
            cells = [f"{source}, first {limit}" if limit else f"{source}, all", f"{row['trajectories']}"]
            for proposer in ("agentspec", "vllm-suffix"):
                pinned, spread = al[f"{proposer}, client"], al[f"{proposer}, spread"]
                cells += [f"{pinned:.3f}", f"{spread:.3f}", f"{pinned / spread:.2f}×"]
            lines.append(_row(cells))
    return "\n".join(lines) + "\n" + _from(RL_ROUTING_60, RL_ROUTING)


def epoch_two(source: str, arm: str) -> Get:
    """benchmarks/rl_epochs.py: epoch 2's AL of ``vllm-suffix``, ``agentspec, kept`` or ``agentspec, retired``."""
    return Get(RL_EPOCHS, ("sources", source, "al", arm))


def table_rl_epochs(results: Results) -> str:
    """docs/rl.md: epoch 2's AL after a weight update, the first epoch's outputs kept or retired."""
    data = results.json(RL_EPOCHS)
    lines = _header("source", "groups", "vLLM suffix", "agentspec, kept", "agentspec, retired", "kept / retired")
    for source, row in data["sources"].items():
        al = row["al"]
        cells = [f"{al[arm]:.3f}" for arm in ("vllm-suffix", "agentspec, kept", "agentspec, retired")]
        lines.append(_row([source, f"{row['groups']}", *cells, f"{row['kept_over_retired']:.2f}×"]))
    return "\n".join(lines) + "\n" + _from(RL_EPOCHS)


def table_dev_suffix_034(results: Results) -> str:
    """docs/bench.md: AL and acceptance of vLLM 0.34's suffix method, 0.32's tree and agentspec."""
    names = ("vllm-suffix", "vllm-suffix-0.32", OURS)
    lines = _header(
        "source", "calls", *(f"AL {n}" for n in names), *(f"accept {n}" for n in names), "agentspec / 0.34 AL"
    )
    for source in sources(results, SUFFIX_034):
        recs = [_rec(results, SUFFIX_034, None, n, source) for n in names]
        cells = [f"{r['al']:.3f}" for r in recs] + [f"{r['acceptance_rate']:.1%}" for r in recs]
        ratio = f"{recs[2]['al'] / recs[0]['al']:.3f}×"
        lines.append(
            _row([source if source != ALL else "all", f"{recs[0]['calls']:,}", *cells, ratio], bold=source == ALL)
        )
    return "\n".join(lines) + "\n" + _from(SUFFIX_034)


TABLES: dict[str, Callable[[Results], str]] = {
    "dev-suffix-034": table_dev_suffix_034,
    "drafter-cost-smollm2-cpu": table_drafter_cost,
    "drafter-train-smollm2-cpu": table_drafter_train,
    "live-drafter-smollm2-cpu": table_live_drafter,
    "replay-drafter-smollm2-cpu": table_replay_drafter,
    "dev-hybrid-share": table_hybrid_share,
    "dev-policy-sweep": table_policy_sweep,
    "dev-chooser-fit": table_chooser_fit,
    "dev-rl-routing": table_rl_routing,
    "dev-rl-epochs": table_rl_epochs,
    "live-smollm2-cpu": table_live,
    "live-smollm2-cpu-vllm034": lambda results: table_live(results, LIVE_034),
    "rl-live-smollm2-cpu": table_rl_live,
    "rl-live-queued-smollm2-cpu": lambda results: table_rl_live(results, RL_LIVE_QUEUED),
    "dev-set": table_dev_set,
    "dev-one-server": table_dev_one_server,
    "dev-eight-replicas": table_dev_eight_replicas,
    "dev-next-targets": table_dev_next_targets,
    "dev-memory": table_dev_memory,
    "dev-loops": table_dev_loops,
    "dev-exchange-lag": table_dev_exchange_lag,
    "dev-speed": table_dev_speed,
    "slice-speed": table_slice_speed,
    "dev-window-seeding": table_window_seeding,
    "h200-calibration": table_calibration,
    "h200-calibration-rows": table_calibration_rows,
    "exchange-throughput": table_exchange_throughput,
}


def render_tables(markdown: str, results: Results) -> str:
    """``markdown`` with every table marker replaced by its table (the site's build)."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"unknown table marker {name!r} (known: {', '.join(TABLES)})")
        return TABLES[name](results)

    return TABLE_MARKER.sub(table, markdown)


# ---------------------------------------------------------------------------- the check


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _number_pattern(text: str) -> re.Pattern[str]:
    parts = [re.escape(_flat(part)).replace(r"\ ", r"\s+") for part in text.split("{}")]
    return re.compile(r"([-+]?[\d,]*\.?\d+)".join(parts))


def check(docs: Path = DOCS, results: Results | None = None) -> tuple[int, int, list[str]]:
    """``(figures checked, tables rendered, problems)`` for the pages in ``docs``."""
    results = results or Results()
    pages: dict[str, str] = {}
    problems: list[str] = []
    checked = 0

    def page(name: str) -> str | None:
        if name not in pages:
            path = docs / name
            pages[name] = _flat(path.read_text()) if path.exists() else ""
        return pages[name] or None

    for figure in figures():
        text = page(figure.page)
        if text is None:
            problems.append(f"{figure.page}: no such page")
            continue
        try:
            expected = figure.expected(results)
        except (LookupError, OSError, ValueError, ZeroDivisionError, TypeError) as exc:
            problems.append(f"{figure.page}: {figure.text!r}: the results do not give it: {exc}")
            continue
        if _flat(expected) in text:
            checked += len(figure.values)
            continue
        shown = _number_pattern(figure.text).search(text)
        if shown is None:
            problems.append(f"{figure.page}: the passage {figure.text!r} is not on the page")
            continue
        for (value, spec), got in zip(figure.values, shown.groups(), strict=True):
            want = format(value(results), spec)
            if got != want:
                problems.append(f"{figure.page}: {figure.text!r} shows {got} where {value} gives {want}")

    tables = 0
    for path in sorted(docs.glob("*.md")):
        for match in TABLE_MARKER.finditer(path.read_text()):
            name = match.group(1)
            if name not in TABLES:
                problems.append(f"{path.name}: unknown table marker {name!r}")
                continue
            try:
                TABLES[name](results)
            except (LookupError, OSError, ValueError, ZeroDivisionError, TypeError) as exc:
                problems.append(f"{path.name}: table {name!r} does not render from the results: {exc!r}")
                continue
            tables += 1
    return checked, tables, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=Path, default=DOCS, help="the Markdown pages (default: docs/)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the JSON results (default: benchmarks/results/)")
    args = parser.parse_args(argv)
    checked, tables, problems = check(args.docs, Results(args.results))
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"checked {checked} figures quoted in the docs and {tables} tables made from {args.results.name}/")
    if checked == 0:
        print("no figure was checked", file=sys.stderr)
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
