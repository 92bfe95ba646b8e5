"""``run_replay``: load, tokenize (cached), replay every source, summarise."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import partial
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentspec.replay.calls import SourceWorkload
from agentspec.replay.config import ReplayConfig
from agentspec.replay.proposer import Proposer, ProposerFactory
from agentspec.replay.registry import make_proposer
from agentspec.replay.simulate import SourceResult, Tally, replay_source
from agentspec.replay.tokenized import TokenCache

ALL = "all"


class Record(BaseModel):
    """One (proposer, source) line of a report; source ``"all"`` sums the sources."""

    model_config = ConfigDict(frozen=True)

    proposer: str
    source: str
    calls: int
    output_tokens: int
    steps: int
    al: float
    acceptance_rate: float
    index_us_per_call: float
    propose_us_per_step: float
    prompt_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    peak_index_mb: float
    est_speedup: float
    routing: str
    #: Output tokens/s of one request's decoding by the cost model (a server's, with
    #: ``--cost-profile``).
    est_tokens_per_s: float = 0.0
    #: AL relative to the oracle's and to the baseline proposer's on the same source.
    al_vs_oracle: float | None = None
    al_vs_baseline: float | None = None
    #: Index memory per token it held, at the memory peak (None: the proposer cannot tell).
    bytes_per_held_token: float | None = None
    #: Mean context tokens of a decoding step (the KV cache it reads).
    context_tokens_per_step: float = 0.0
    #: Proposals by outcome, ``(drafted, accepted, count)`` rows (agentspec.draft_budget.speed_model.DraftOutcomes).
    draft_outcomes: list[tuple[int, int, int]] = []
    #: ``draft_outcomes`` under each probability cut of a model budget (agentspec.draft_budget.speed_budget),
    #: keyed by the cut; empty for proposers whose drafts carry no path probabilities.
    draft_outcomes_by_cut: dict[str, list[tuple[int, int, int]]] = {}
    #: The proposer's own counters (the hybrid's: agentspec.replay.model_drafting.HYBRID_COUNTERS).
    counters: dict[str, int] = {}


class ReplayResult(BaseModel):
    settings: dict[str, Any]
    records: list[Record]
    trajectories: dict[str, int]
    wall_s: float

    def record(self, proposer: str, source: str = ALL) -> Record:
        for r in self.records:
            if r.proposer == proposer and r.source == source:
                return r
        raise KeyError((proposer, source))

    def sources(self) -> list[str]:
        return list(dict.fromkeys(r.source for r in self.records))

    def proposers(self) -> list[str]:
        return list(dict.fromkeys(r.proposer for r in self.records))

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "settings": {**self.settings, "wall_s": round(self.wall_s, 3), "trajectories": self.trajectories},
            "records": [r.model_dump() for r in self.records],
        }


#: Factories a caller adds to the proposers a replay can name (see agentspec.replay.registry).
ExtraProposers = Mapping[str, ProposerFactory] | None


def _factories(config: ReplayConfig, extra: ExtraProposers) -> dict[str, Callable[[], Proposer]]:
    return {name: partial(make_proposer, name, config.proposer_settings, extra) for name in config.proposers}


def _check_proposers(config: ReplayConfig, extra: ExtraProposers) -> None:
    # Build one of each up front: a missing dependency fails before any work.
    for name in config.proposers:
        make_proposer(name, config.proposer_settings, extra)


def replay_workloads(
    config: ReplayConfig,
    workloads: Mapping[str, SourceWorkload],
    on_call: Callable[[str], None] | None = None,
    proposers: ExtraProposers = None,
) -> list[SourceResult]:
    """Replay pre-built workloads (e.g. pre-tokenized calls) in this process.

    ``proposers`` adds factories to those the replay can name (see
    :mod:`agentspec.replay.registry`).
    """
    factories = _factories(config, proposers)
    routing = {name: config.routing_for(name) for name in config.proposers}
    return [
        replay_source(
            source,
            wl,
            factories,
            routing,
            replicas=config.replicas,
            concurrency=config.concurrency,
            memory_every=config.memory_every,
            on_call=(partial(on_call, source) if on_call else None),
            exchange=config.exchange,
            exchange_lag=config.exchange_lag,
            lockstep=config.lockstep,
        )
        for source, wl in workloads.items()
    ]


def _replay_cached_source(config: ReplayConfig, source: str, proposers: ExtraProposers) -> SourceResult:
    """One source, start to end, from the token cache (runs in a worker process)."""
    cache = TokenCache.with_tokenizer(config.data_path(), config.cache_dir, config.tokenizer_folder())
    wl = cache.load(source).workload(config.limit, config.window, config.seed_dropped)
    return replay_workloads(config, {source: wl}, proposers=proposers)[0]


def run_replay(
    config: ReplayConfig,
    on_tokenized: Callable[[str], None] | None = None,
    on_start: Callable[[str, int], None] | None = None,
    on_call: Callable[[str], None] | None = None,
    on_source_done: Callable[[SourceResult], None] | None = None,
    proposers: ExtraProposers = None,
) -> ReplayResult:
    """Replay the configured trajectories through every configured proposer.

    The callbacks feed progress displays: ``on_start(source, n_calls)`` once per
    source, ``on_call(source)`` per call (in-process runs only), and
    ``on_source_done`` when a source finishes. ``proposers`` adds factories to those the
    replay can name (see :mod:`agentspec.replay.registry`).
    """
    start = time.perf_counter()
    _check_proposers(config, proposers)
    cache = TokenCache.with_tokenizer(config.data_path(), config.cache_dir, config.tokenizer_folder())
    available = cache.sources()
    sources = list(config.sources) if config.sources else list(available)
    unknown = [s for s in sources if s not in available]
    if unknown:
        raise ValueError(f"sources not in the data: {unknown}; available: {list(available)}")
    cache.ensure(sources, on_source=on_tokenized)

    results: list[SourceResult] = []
    if config.jobs == 1 or len(sources) == 1:
        for s in sources:
            wl = cache.load(s).workload(config.limit, config.window, config.seed_dropped)
            if on_start:
                on_start(s, sum(len(t) for t in wl))
            (res,) = replay_workloads(config, {s: wl}, on_call, proposers)
            results.append(res)
            if on_source_done:
                on_source_done(res)
    else:
        if on_start:
            for s in sources:
                wl = cache.load(s).workload(config.limit, config.window, config.seed_dropped)
                on_start(s, sum(len(t) for t in wl))
        # spawn: the parent may hold threads (progress display) and native state.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=config.jobs, mp_context=ctx) as ex:
            futures = {ex.submit(_replay_cached_source, config, s, proposers): s for s in sources}
            by_source: dict[str, SourceResult] = {}
            for fut in as_completed(futures):
                res = fut.result()
                by_source[res.source] = res
                if on_source_done:
                    on_source_done(res)
        results = [by_source[s] for s in sources]
    return summarise(config, results, time.perf_counter() - start)


def summarise(config: ReplayConfig, results: list[SourceResult], wall_s: float) -> ReplayResult:
    """Per-source and overall records, with ratios to the oracle and the baseline."""
    tallies: dict[tuple[str, str], Tally] = {}
    for res in results:
        for name, t in res.tallies.items():
            tallies[(name, res.source)] = t
            tallies.setdefault((name, ALL), Tally()).add(t)
    sources = [r.source for r in results] + ([ALL] if results else [])

    def record(name: str, source: str) -> Record:
        t = tallies[(name, source)]
        return Record(
            proposer=name,
            source=source,
            calls=t.calls,
            output_tokens=t.output_tokens,
            steps=t.steps,
            al=t.output_tokens / t.steps if t.steps else 1.0,
            acceptance_rate=t.accepted_tokens / t.drafted_tokens if t.drafted_tokens else 0.0,
            index_us_per_call=t.index_ns / 1e3 / t.calls if t.calls else 0.0,
            propose_us_per_step=t.propose_ns / 1e3 / t.proposals if t.proposals else 0.0,
            prompt_tokens=t.prompt_tokens,
            drafted_tokens=t.drafted_tokens,
            accepted_tokens=t.accepted_tokens,
            peak_index_mb=t.peak_memory_bytes / 2**20,
            est_speedup=config.cost.speedup(t.output_tokens, t.steps, t.drafted_tokens, t.propose_ns, t.index_ns),
            est_tokens_per_s=config.cost.tokens_per_second(
                t.output_tokens, t.steps, t.drafted_tokens, t.propose_ns, t.index_ns
            ),
            routing=config.routing_for(name).value if config.replicas > 1 else "single",
            bytes_per_held_token=t.peak_memory_bytes / t.held_tokens_at_peak if t.held_tokens_at_peak else None,
            context_tokens_per_step=t.context_tokens / t.proposals if t.proposals else 0.0,
            draft_outcomes=[(d, a, n) for (d, a), n in sorted(t.outcomes.items())],
            draft_outcomes_by_cut={
                str(cut): [(d, a, n) for (d, a), n in sorted(counts.items())]
                for cut, counts in sorted(t.cut_outcomes.items())
            },
            counters=dict(sorted(t.counters.items())),
        )

    records: list[Record] = []
    for source in sources:
        base = {name: record(name, source) for name in config.proposers}
        oracle = base.get("oracle")
        ref = base.get(config.baseline)
        for r in base.values():
            records.append(
                r.model_copy(
                    update={
                        "al_vs_oracle": r.al / oracle.al if oracle else None,
                        "al_vs_baseline": r.al / ref.al if ref else None,
                    }
                )
            )
    settings = config.model_dump(mode="json")
    settings["data"] = config.data_path().name if config.data is None else str(config.data)
    settings["routing_effective"] = {n: config.routing_for(n).value for n in config.proposers}
    return ReplayResult(
        settings=settings,
        records=records,
        trajectories={r.source: r.trajectories for r in results},
        wall_s=wall_s,
    )
