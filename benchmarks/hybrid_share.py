"""What hybrid drafting could add: the steps the draft index has no confident draft for.

    python benchmarks/hybrid_share.py --data data/trajectories-dev.jsonl.gz [--limit N] [--jobs 1]

With a model drafter beside it (``agentspec serve --agentspec-drafter MODEL``), the server
takes the index's draft for a step when its expected accepted tokens
(:meth:`~agentspec.index.DraftIndex.expected_accepted`: the draft's score weighted by its
level's calibration) are at least the model drafter's, and the model's draft otherwise
(:mod:`agentspec.draft_budget.drafter_choice`). A model drafter can therefore only add something on the
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
accepted on the steps below each ``T`` (what the model drafter would have to beat there),
and the shares they give.

The counting is :mod:`agentspec.replay.hybrid_share`; ``agentspec bench --hybrid-share``
prints the same table after its report.

No model drafter runs here (none with the data's vocabulary is at hand) and nothing is
assumed about what one would accept: these are the steps a model drafter *could* draft,
not a speed-up. They are the steps of the index-only decoding; where a model draft were
accepted, the later steps of the call would fall elsewhere. The index here verifies all of
its drafts, so its calibration learns from every draft (under the hybrid, only from those
it sends).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from agentspec.replay import ReplayConfig
from agentspec.replay.hybrid_share import (
    THRESHOLDS,
    ShareCounts,
    print_share_table,
    run_share,
    share_json,
)
from agentspec.replay.tokenized import TokenCache

console = Console(width=None if sys.stdout.isatty() else 200)
progress = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


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
    available = TokenCache(data).sources()
    sources = source or list(available)
    unknown = [s for s in sources if s not in available]
    if unknown:
        raise typer.BadParameter(f"sources not in the data: {unknown}; available: {list(available)}")
    config = ReplayConfig(data=data, sources=tuple(sources), limit=limit, jobs=jobs, proposers=("agentspec",))
    by_source = run_share(config, on_source_done=_progress)
    print_share_table(console, by_source, limit)
    if json_out is not None:
        json_out.write_text(json.dumps(share_json(by_source), indent=1))


if __name__ == "__main__":
    typer.run(main)
