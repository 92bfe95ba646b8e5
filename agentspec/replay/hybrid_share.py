"""The hybrid's addressable share: the steps the index has no confident draft for.

With a model drafter beside it (``agentspec serve --agentspec-drafter MODEL``), the server
takes the index's draft for a step when its expected accepted tokens
(:meth:`~agentspec.index.DraftIndex.expected_accepted`: the draft's score weighted by its
level's calibration) are at least the model drafter's, and the model's draft otherwise
(:mod:`agentspec.draft_budget.drafter_choice`). A model drafter can only add something on the steps
where the index drafted nothing, or drafted something expected to deliver fewer tokens than
the model's draft, ``T`` (:data:`THRESHOLDS`: 1, 2 and 4; a 4-token drafter accepting 60% of
its tokens in turn expects about 1.3, one that is always right expects 4).

:func:`replay_share` replays a workload through agentspec as the replay runs it (the
server's own :class:`~agentspec.driver.RequestDriver` over a
:class:`~agentspec.index.DraftIndex`, drafting exactly what the ``agentspec`` proposer
drafts) and counts those steps and the output tokens decoded on them (:class:`ShareCounts`).
No model drafter runs and nothing is assumed about what one would accept: these are steps a
model drafter *could* draft, not a speed-up. They are the steps of the index-only decoding
(where a model draft were accepted, the call's later steps would fall elsewhere), and the
index verifies all of its drafts, so its calibration learns from every draft (under the
hybrid, only from those it sends). ``agentspec bench --hybrid-share`` and
``benchmarks/hybrid_share.py`` print the table (:func:`share_table`); docs/bench.md.
"""

from __future__ import annotations

import json
import multiprocessing
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from agentspec.replay.calls import SourceWorkload
from agentspec.replay.config import ReplayConfig
from agentspec.replay.driver_proposer import DriverProposer, make_agentspec_index
from agentspec.replay.proposer import EMPTY_DRAFT, ReplayDraft
from agentspec.replay.run import ALL, replay_workloads
from agentspec.replay.settings import ProposerSettings
from agentspec.replay.tokenized import TokenCache

__all__ = [
    "CAVEAT",
    "THRESHOLDS",
    "ConfidenceCounter",
    "ShareCounts",
    "add_share_json",
    "print_share_table",
    "replay_share",
    "run_share",
    "share_json",
    "share_record",
    "share_table",
]

#: Expected accepted tokens of the model drafter's draft the index's draft is compared with.
THRESHOLDS: tuple[float, ...] = (1.0, 2.0, 4.0)
#: The name the counting proposer replays under.
PROPOSER = "agentspec-hybrid-share"
#: Printed under the table.
CAVEAT = (
    "Shares of all steps (and of all output tokens) on which a model drafter could draft"
    " instead of the index: what it would accept there is not measured; this is not a speed-up."
)


@dataclass
class ShareCounts:
    """Steps and output tokens of one replay, by how confident the index's draft was."""

    calls: int = 0
    #: Every step of the replay (prefill steps included) and every output token.
    steps: int = 0
    output_tokens: int = 0
    #: Steps the index was asked to draft for (all but the prefill steps).
    drafting_steps: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    no_draft_steps: int = 0
    no_draft_tokens: int = 0
    #: By threshold: steps whose draft is expected to deliver fewer tokens, the output tokens
    #: decoded on them, and the draft tokens the index's own drafts had accepted on them.
    below_steps: dict[float, int] = field(default_factory=lambda: dict.fromkeys(THRESHOLDS, 0))
    below_tokens: dict[float, int] = field(default_factory=lambda: dict.fromkeys(THRESHOLDS, 0))
    below_accepted: dict[float, int] = field(default_factory=lambda: dict.fromkeys(THRESHOLDS, 0))

    def add(self, other: ShareCounts) -> None:
        for name, value in vars(other).items():
            if isinstance(value, dict):
                mine = getattr(self, name)
                for t, n in value.items():
                    mine[t] = mine.get(t, 0) + n
            else:
                setattr(self, name, getattr(self, name) + value)

    def step_share(self, threshold: float | None) -> float:
        """Share of steps with no draft (``None``) or below ``threshold``."""
        n = self.no_draft_steps if threshold is None else self.below_steps[threshold]
        return n / self.steps if self.steps else 0.0

    def token_share(self, threshold: float | None) -> float:
        """Share of output tokens decoded on steps with no draft (``None``) or below ``threshold``."""
        n = self.no_draft_tokens if threshold is None else self.below_tokens[threshold]
        return n / self.output_tokens if self.output_tokens else 0.0


class ConfidenceCounter(DriverProposer):
    """agentspec as the replay runs it, counting each step by its draft's expected accepted
    tokens as the hybrid computes them. What it drafts is exactly what DriverProposer drafts."""

    def __init__(self, settings: ProposerSettings, counts: ShareCounts) -> None:
        super().__init__(make_agentspec_index(settings))
        self.counts = counts
        # Per call: the expected accepted tokens of the step just proposed (None: no draft).
        self._pending: dict[str, float | None] = {}
        self._accepted: dict[str, int] = {}

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        d = self.driver.draft(call_id)
        if d is None or not d.token_ids:
            self._pending[call_id] = None
            return EMPTY_DRAFT
        spec = self.driver.spec(call_id)
        self._pending[call_id] = self.index.expected_accepted(d, spec.tenant if spec is not None else "")
        return ReplayDraft(d.token_ids)

    def verified(self, call_id: str, drafted: int, accepted: int) -> None:
        self._accepted[call_id] = accepted
        super().verified(call_id, drafted, accepted)

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        if call_id in self._pending:  # not the prefill step's token
            self._count(self._pending.pop(call_id), len(tokens), self._accepted.pop(call_id, 0))
        super().observe(call_id, tokens)

    def _count(self, expected: float | None, emitted: int, accepted: int) -> None:
        c = self.counts
        c.drafting_steps += 1
        if expected is None:
            c.no_draft_steps += 1
            c.no_draft_tokens += emitted
            expected = 0.0
        for t in THRESHOLDS:
            if expected < t:
                c.below_steps[t] += 1
                c.below_tokens[t] += emitted
                c.below_accepted[t] += accepted

    def end_call(self, call_id: str) -> None:
        if call_id in self._pending:
            raise RuntimeError(f"call {call_id}: a draft was proposed but its step never emitted")
        self._accepted.pop(call_id, None)
        super().end_call(call_id)


def _share_config(config: ReplayConfig) -> ReplayConfig:
    """The counting replay of ``config``'s agentspec: its servers, routing and settings."""
    return ReplayConfig(
        proposers=(PROPOSER,),
        routing={PROPOSER: config.routing_for("agentspec")},
        replicas=config.replicas,
        exchange=config.exchange,
        exchange_lag=config.exchange_lag,
        concurrency=config.concurrency,
        lockstep=config.lockstep,
        memory_every=config.memory_every,
        proposer_settings=config.proposer_settings,
    )


def replay_share(
    source: str,
    workload: SourceWorkload,
    settings: ProposerSettings | None = None,
    *,
    config: ReplayConfig | None = None,
    on_call: Callable[[str], None] | None = None,
) -> ShareCounts:
    """Replay one source's workload through agentspec and count the steps.

    By default on one server, as ``ReplayConfig()`` replays agentspec; ``config`` replays it
    as that run does (its replicas, agentspec's routing, exchange, concurrency and proposer
    settings; ``settings``, when given, replaces the proposer settings).
    """
    base = config if config is not None else ReplayConfig(proposers=("agentspec",))
    if settings is not None:
        base = base.model_copy(update={"proposer_settings": settings})
    counts = ShareCounts()
    (result,) = replay_workloads(
        _share_config(base),
        {source: workload},
        on_call=on_call,
        proposers={PROPOSER: lambda s: ConfidenceCounter(s, counts)},
    )
    tally = result.tallies[PROPOSER]
    counts.calls = tally.calls
    counts.steps = tally.steps
    counts.output_tokens = tally.output_tokens
    counts.drafted_tokens = tally.drafted_tokens
    counts.accepted_tokens = tally.accepted_tokens
    if counts.drafting_steps != tally.proposals:
        raise RuntimeError(f"{source}: counted {counts.drafting_steps} drafting steps, the replay {tally.proposals}")
    return counts


def _load(config: ReplayConfig, cache: TokenCache, source: str) -> SourceWorkload:
    return cache.load(source).workload(config.limit, config.window, config.seed_dropped)


def _share_cached_source(config: ReplayConfig, source: str) -> ShareCounts:
    """One source, start to end, from the token cache (runs in a worker process)."""
    cache = TokenCache(config.data_path(), config.cache_dir)
    return replay_share(source, _load(config, cache, source), config=config)


def run_share(
    config: ReplayConfig,
    on_tokenized: Callable[[str], None] | None = None,
    on_start: Callable[[str, int], None] | None = None,
    on_call: Callable[[str], None] | None = None,
    on_source_done: Callable[[str, ShareCounts], None] | None = None,
) -> dict[str, ShareCounts]:
    """:func:`replay_share` for each of ``config``'s sources, as
    :func:`~agentspec.replay.run.run_replay` replays them (data, token cache, sources, limit,
    window, ``jobs`` processes; callbacks likewise, ``on_call`` in-process only).

    Returns the counts by source, in the sources' order.
    """
    cache = TokenCache(config.data_path(), config.cache_dir)
    available = cache.sources()
    sources = list(config.sources) if config.sources else list(available)
    unknown = [s for s in sources if s not in available]
    if unknown:
        raise ValueError(f"sources not in the data: {unknown}; available: {list(available)}")
    cache.ensure(sources, on_source=on_tokenized)

    by_source: dict[str, ShareCounts] = {}
    if config.jobs == 1 or len(sources) == 1:
        for s in sources:
            wl = _load(config, cache, s)
            if on_start:
                on_start(s, sum(len(t) for t in wl))
            by_source[s] = replay_share(s, wl, config=config, on_call=on_call)
            if on_source_done:
                on_source_done(s, by_source[s])
    else:
        if on_start:
            for s in sources:
                on_start(s, sum(len(t) for t in _load(config, cache, s)))
        # spawn: the parent may hold threads (progress display) and native state.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=config.jobs, mp_context=ctx) as ex:
            futures = {ex.submit(_share_cached_source, config, s): s for s in sources}
            for fut in as_completed(futures):
                s = futures[fut]
                by_source[s] = fut.result()
                if on_source_done:
                    on_source_done(s, by_source[s])
    return {s: by_source[s] for s in sources}


def _total(by_source: Mapping[str, ShareCounts]) -> ShareCounts:
    total = ShareCounts()
    for c in by_source.values():
        total.add(c)
    return total


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _row(name: str, c: ShareCounts) -> list[str]:
    cols = [None, *THRESHOLDS]
    return [
        name,
        str(c.calls),
        str(c.steps),
        *(_pct(c.step_share(t)) for t in cols),
        *(_pct(c.token_share(t)) for t in cols),
    ]


def share_table(by_source: Mapping[str, ShareCounts], limit: int | None = None, replicas: int = 1) -> Table:
    """One row per source and an 'all sources' row: the shares of steps and of output
    tokens with no draft and below each threshold."""
    scope = "every trajectory" if limit is None else f"at most {limit} trajectories per source"
    servers = "one server" if replicas == 1 else f"{replicas} servers"
    table = Table(
        title=f"Steps where the index has no confident draft (E: its expected accepted tokens), {scope}, {servers}"
    )
    headers = ["source", "calls", "steps", "no draft", *(f"E<{t:g}" for t in THRESHOLDS)]
    headers += ["tokens: no draft", *(f"tokens: E<{t:g}" for t in THRESHOLDS)]
    for col in headers:
        table.add_column(col, justify="left" if col == "source" else "right")
    for name, c in by_source.items():
        table.add_row(*_row(name, c))
    table.add_row(*_row("all sources", _total(by_source)), style="bold")
    return table


def print_share_table(
    console: Console, by_source: Mapping[str, ShareCounts], limit: int | None = None, replicas: int = 1
) -> None:
    """:func:`share_table` and the :data:`CAVEAT` under it."""
    console.print(share_table(by_source, limit, replicas))
    console.print(CAVEAT, highlight=False)


def share_record(c: ShareCounts) -> dict[str, Any]:
    """The counts, and the shares they give (``no_draft_step_share``, ``below_step_share``
    by threshold, and the same of output tokens)."""
    return asdict(c) | {
        "no_draft_step_share": c.step_share(None),
        "no_draft_token_share": c.token_share(None),
        "below_step_share": {t: c.step_share(t) for t in THRESHOLDS},
        "below_token_share": {t: c.token_share(t) for t in THRESHOLDS},
    }


def share_json(by_source: Mapping[str, ShareCounts]) -> dict[str, Any]:
    """``{source: record, ..., "all": record}`` (:func:`share_record`; JSON turns the
    thresholds into keys "1.0", "2.0", "4.0")."""
    return {name: share_record(c) for name, c in by_source.items()} | {ALL: share_record(_total(by_source))}


def add_share_json(path: Path, by_source: Mapping[str, ShareCounts]) -> None:
    """Add the counts to a JSON report (``agentspec bench --json``) under ``"hybrid_share"``."""
    data = json.loads(path.read_text())
    data["hybrid_share"] = share_json(by_source)
    path.write_text(json.dumps(data, indent=2) + "\n")
