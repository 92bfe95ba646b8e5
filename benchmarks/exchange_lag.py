"""What the replica exchange is worth when it delivers late.

    python benchmarks/exchange_lag.py --data data/trajectories-dev.jsonl.gz [--limit N] [--jobs 2]
        [--lags 0,8,64]

A real exchange delivers an output a poll interval and a network hop after its call ended
(docs/fleet.md); recordings carry no times, so the replay counts the delay in calls of the
same source (``--exchange-lag``). Replays, per source and overall:

- agentspec on one server (what the exchange tries to give a fleet back);
- vLLM's suffix method spread over 8 replicas (a session-unaware router);
- agentspec pinned by group on 8 replicas, without the exchange and with it at each lag.

Prints AL and the ratios to suffix spread and to one server. The replay is deterministic
(AL counts steps, not seconds), so runs of one invocation compare exactly.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentspec.replay import ReplayConfig, ReplayResult, Routing, run_replay

BASE, OURS = "vllm-suffix", "agentspec"
ALL = "all"
console = Console(width=None if sys.stdout.isatty() else 200)


def main(
    data: Annotated[Path, typer.Option(help="Trajectories file (.jsonl[.gz]).")],
    limit: Annotated[int | None, typer.Option(help="At most N trajectories per source.")] = None,
    jobs: Annotated[int, typer.Option(help="Sources replayed in parallel processes.")] = 1,
    lags: Annotated[str, typer.Option(help="Delivery delays to replay, in calls.")] = "0,8,64",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write every record here.")] = None,
) -> None:
    delays = [int(v) for v in lags.split(",") if v.strip()]
    common = {"data": data, "limit": limit, "jobs": jobs}
    one = run_replay(ReplayConfig(**common, proposers=(OURS,)))
    apart = run_replay(
        ReplayConfig(**common, replicas=8, routing={OURS: Routing.GROUP, BASE: Routing.SPREAD}, proposers=(BASE, OURS))
    )
    lagged: dict[int, ReplayResult] = {
        lag: run_replay(
            ReplayConfig(
                **common, replicas=8, routing={OURS: Routing.GROUP}, proposers=(OURS,), exchange=True, exchange_lag=lag
            )
        )
        for lag in delays
    }

    table = Table(title="8 replicas: AL, and ratios to vllm-suffix spread (/spread) and to one agentspec server (/one)")
    columns = ["source", "one server", "suffix spread", "no exchange"] + [f"lag {lag}" for lag in delays]
    for col in columns:
        table.add_column(col, justify="left" if col == "source" else "right")
    for source in apart.sources():
        base = apart.record(BASE, source).al
        single = one.record(OURS, source).al

        def cell(al: float, base: float = base, single: float = single) -> str:
            return f"{al:.3f} ({al / base:.2f}/spread, {al / single:.2f}/one)"

        table.add_row(
            source,
            f"{single:.3f}",
            f"{base:.3f}",
            cell(apart.record(OURS, source).al),
            *(cell(lagged[lag].record(OURS, source).al) for lag in delays),
        )
    console.print(table)
    if json_out is not None:
        json_out.write_text(
            json.dumps(
                {
                    "one_server": one.to_json_dict(),
                    "eight_replicas": apart.to_json_dict(),
                    **{f"eight_replicas_lag_{lag}": r.to_json_dict() for lag, r in lagged.items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    typer.run(main)
