"""What hybrid drafting could add: the steps the draft index has no confident draft for.

    python benchmarks/hybrid_share.py --data trajectories-dev.jsonl.gz [--limit N] [--jobs 1]

With a model drafter beside it (``agentspec serve --agentspec-drafter MODEL``), the server
takes the index's draft for a step when its expected accepted tokens
(:meth:`~agentspec.index.DraftIndex.expected_accepted`: the draft's score weighted by its
level's calibration) are at least the model drafter's, and the model's draft otherwise
(:mod:`agentspec.drafter_choice`). A model drafter can therefore only add something on the
steps where the index has no confident draft: it drafted nothing, or its draft is expected
to deliver fewer tokens than the model's draft, ``T``. This replays every call through
agentspec on one server, exactly as ``agentspec`` runs in the replay (the server's own
:class:`~agentspec.driver.RequestDriver` over a :class:`~agentspec.index.DraftIndex`), and
counts, per source and over all sources:

- ``steps``: every decoding step of the replay (a call's prefill step included, as the
  replay counts it; nothing drafts for that one);
- the share of those steps on which the index drafted nothing (``no draft``), and on which
  it drafted nothing or its draft is expected to deliver fewer than ``T`` = 1, 2 or 4 tokens
  (``E<T``; a 4-token drafter accepting 60% of its tokens in turn expects about 1.3, one
  that is always right expects 4);
- the share of the output tokens decoded on those steps (the draft tokens the index had
  accepted there and the step's own token).

``--json FILE`` also writes the counts, with the draft tokens the index's own drafts had
accepted on the steps below each ``T`` (what the model drafter would have to beat there).

No model drafter runs here (none with the data's vocabulary is at hand) and nothing is
assumed about what one would accept: these are the steps a model drafter *could* draft,
not a speed-up. They are the steps of the index-only decoding; where a model draft were
accepted, the later steps of the call would fall elsewhere. The index here verifies all of
its drafts, so its calibration learns from every draft (under the hybrid, only from those
it sends).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from agentspec.replay import ProposerSettings, ReplayConfig, Routing, replay_workloads
from agentspec.replay.calls import SourceWorkload
from agentspec.replay.driver_proposer import DriverProposer, make_agentspec_index
from agentspec.replay.proposer import EMPTY_DRAFT, ReplayDraft
from agentspec.replay.tokenized import TokenCache

#: Expected accepted tokens of the model drafter's draft the index's draft is compared with.
THRESHOLDS: tuple[float, ...] = (1.0, 2.0, 4.0)
PROPOSER = "agentspec-hybrid-share"
console = Console(width=None if sys.stdout.isatty() else 200)
progress = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


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


def replay_share(source: str, workload: SourceWorkload, settings: ProposerSettings | None = None) -> ShareCounts:
    """Replay one source's workload through agentspec on one server; count the steps."""
    counts = ShareCounts()
    config = ReplayConfig(
        proposers=(PROPOSER,),
        routing={PROPOSER: Routing.GROUP},
        proposer_settings=settings or ProposerSettings(),
    )
    (result,) = replay_workloads(config, {source: workload}, proposers={PROPOSER: lambda s: ConfidenceCounter(s, counts)})
    tally = result.tallies[PROPOSER]
    counts.calls = tally.calls
    counts.steps = tally.steps
    counts.output_tokens = tally.output_tokens
    counts.drafted_tokens = tally.drafted_tokens
    counts.accepted_tokens = tally.accepted_tokens
    if counts.drafting_steps != tally.proposals:
        raise RuntimeError(f"{source}: counted {counts.drafting_steps} drafting steps, the replay {tally.proposals}")
    return counts


def _replay_cached(data: Path, source: str, limit: int | None) -> ShareCounts:
    """One source from the token cache (also in a worker process)."""
    return replay_share(source, TokenCache(data).load(source).workload(limit))


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


def _progress(name: str, c: ShareCounts) -> None:
    shares = ", ".join(f"E<{t:g} {_pct(c.step_share(t))}" for t in THRESHOLDS)
    progress.print(f"{name}: {c.steps} steps, no draft {_pct(c.step_share(None))}, {shares}", highlight=False)


def main(
    data: Annotated[Path, typer.Option(help="Trajectories file (.jsonl[.gz]).")],
    limit: Annotated[int | None, typer.Option(help="At most N trajectories per source.")] = None,
    jobs: Annotated[int, typer.Option(help="Sources replayed in parallel processes.")] = 1,
    source: Annotated[list[str] | None, typer.Option(help="Sources to replay (default: all).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the counts per source here.")] = None,
) -> None:
    cache = TokenCache(data)
    available = cache.sources()
    sources: Sequence[str] = source or list(available)
    unknown = [s for s in sources if s not in available]
    if unknown:
        raise typer.BadParameter(f"sources not in the data: {unknown}; available: {list(available)}")
    cache.ensure(sources)
    by_source: dict[str, ShareCounts] = {}
    if jobs == 1 or len(sources) == 1:
        for name in sources:
            by_source[name] = _replay_cached(data, name, limit)
            _progress(name, by_source[name])
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            futures = {name: ex.submit(_replay_cached, data, name, limit) for name in sources}
            for name, fut in futures.items():
                by_source[name] = fut.result()
                _progress(name, by_source[name])

    total = ShareCounts()
    for c in by_source.values():
        total.add(c)
    scope = "every trajectory" if limit is None else f"at most {limit} trajectories per source"
    table = Table(
        title=f"Steps where the index has no confident draft (E: its expected accepted tokens), {scope}, one server"
    )
    headers = ["source", "calls", "steps", "no draft", *(f"E<{t:g}" for t in THRESHOLDS)]
    headers += ["tokens: no draft", *(f"tokens: E<{t:g}" for t in THRESHOLDS)]
    for col in headers:
        table.add_column(col, justify="left" if col == "source" else "right")
    for name, c in by_source.items():
        table.add_row(*_row(name, c))
    table.add_row(*_row("all sources", total), style="bold")
    console.print(table)
    console.print(
        "Shares of all steps (and of all output tokens) on which a model drafter could draft"
        " instead of the index: what it would accept there is not measured; this is not a speed-up.",
        highlight=False,
    )
    if json_out is not None:
        out = {name: asdict(c) for name, c in by_source.items()} | {"all": asdict(total)}
        json_out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    typer.run(main)
