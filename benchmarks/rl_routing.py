"""RL groups on a fleet: the rollout client's pinning vs spreading a group's samples.

    python benchmarks/rl_routing.py --data data/trajectories-dev.jsonl.gz [--sources codet,tot]
        [--replicas 8] [--exchange] [--limit N] [--proposers agentspec,vllm-suffix] [--json FILE]

Each source's recorded sibling groups (GRPO-like: several samples of one prompt) are
replayed on ``--replicas`` servers, each with the engine's own request driver and index
(agentspec) or vLLM's suffix method, twice: routed as agentspec-rl's ``RolloutClient``
routes them (its session-aware client's ``PinTable``: a group pinned to one server by
rendezvous hashing with bounded load), and spread as a group-blind balancer would (each
call anywhere). The table prints AL (output tokens per decoding step) each way and the
ratio pinned / spread per source. ``--exchange`` lets agentspec's replicas exchange finished
outputs (``--agentspec-exchange-dir``), which narrows what spreading costs.

``--proposers`` replays the arms of some of the two only (the arms share nothing, so a run
of each gives the figures of a run of both).

``--json FILE`` also writes the run: its settings (the data file by name only) and, per
source, the trajectories replayed, each arm's counts (calls, output tokens, steps, drafted
and accepted tokens) and AL, and the two ratios the table prints. docs/rl.md's table of the
first 60 groups is made from such a file (``benchmarks/results/dev-rl-routing-60.json``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentspec.replay import ProposerSettings
from agentspec.replay.baselines import VllmSuffixTreeProposer
from agentspec.replay.config import Routing
from agentspec.replay.driver_proposer import DriverProposer, make_agentspec_index
from agentspec.replay.proposer import Proposer
from agentspec.replay.simulate import replay_source
from agentspec.replay.tokenized import TokenCache

CONCURRENCY = 8  # trajectories in flight, as in agentspec bench
#: The counts of a replay's tally that the JSON keeps.
COUNTS = ("calls", "output_tokens", "steps", "drafted_tokens", "accepted_tokens")


def _agentspec() -> Proposer:
    return DriverProposer(make_agentspec_index(ProposerSettings()))


PROPOSERS: dict[str, tuple[Callable[[], Proposer], Routing]] = {
    "agentspec, client": (_agentspec, Routing.CLIENT),
    "agentspec, spread": (_agentspec, Routing.SPREAD),
    "vllm-suffix, client": (VllmSuffixTreeProposer, Routing.CLIENT),
    "vllm-suffix, spread": (VllmSuffixTreeProposer, Routing.SPREAD),
}
#: Each proposer's AL pinned over spread, as the JSON names it.
RATIOS = {"agentspec": "agentspec_client_over_spread", "vllm-suffix": "suffix_client_over_spread"}


def main(
    data: Annotated[Path, typer.Option(help="Trajectories file (.jsonl[.gz]).")],
    sources: Annotated[str, typer.Option(help="Sources with sibling samples, comma-separated.")] = "codet,tot",
    replicas: Annotated[int, typer.Option(help="Servers in the fleet.", min=2)] = 8,
    exchange: Annotated[bool, typer.Option(help="agentspec's replicas exchange finished outputs.")] = False,
    limit: Annotated[int | None, typer.Option(help="Trajectories per source.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Token cache (default ~/.cache/agentspec/replay).")] = None,
    proposers: Annotated[
        str, typer.Option(help="Whose arms to replay, comma-separated: agentspec, vllm-suffix.")
    ] = "agentspec,vllm-suffix",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the run's figures here.")] = None,
) -> None:
    started = time.perf_counter()
    chosen = [p for p in RATIOS if p in proposers.split(",")]
    unknown = set(proposers.split(",")) - set(RATIOS)
    if unknown or not chosen:
        raise typer.BadParameter(f"proposers are agentspec and vllm-suffix, not {sorted(unknown) or proposers!r}")
    arms = {label: arm for label, arm in PROPOSERS.items() if label.split(",")[0] in chosen}
    cache = TokenCache(data, cache_dir)
    names = [s for s in sources.split(",") if s]
    cache.ensure(names)
    exchanging = " (exchange on)" if exchange else ""
    title = f"AL on {replicas} replicas: groups pinned by the rollout client vs spread{exchanging}"
    short = {"agentspec": "agentspec", "vllm-suffix": "suffix"}
    table = Table("source", "trajectories", *arms, *(f"{short[p]} client / spread" for p in chosen), title=title)
    by_source: dict[str, Any] = {}
    for name in names:
        workload = cache.load(name).workload(limit, None)
        result = replay_source(
            name,
            workload,
            {label: make for label, (make, _) in arms.items()},
            {label: routing for label, (_, routing) in arms.items()},
            replicas=replicas,
            concurrency=CONCURRENCY,
            exchange=exchange,
        )
        al = {label: t.output_tokens / t.steps for label, t in result.tallies.items()}
        ratios = {RATIOS[p]: al[f"{p}, client"] / al[f"{p}, spread"] for p in chosen}
        by_source[name] = {
            "trajectories": len(workload),
            "counts": {label: {c: getattr(t, c) for c in COUNTS} for label, t in result.tallies.items()},
            "al": al,
            **ratios,
        }
        table.add_row(
            name,
            str(len(workload)),
            *(f"{al[label]:.3f}" for label in arms),
            *(f"{r:.2f}x" for r in ratios.values()),
        )
    Console(width=200).print(table)
    if json_out is not None:
        settings = {
            "data": data.name,
            "sources": names,
            "replicas": replicas,
            "exchange": exchange,
            "limit": limit,
            "concurrency": CONCURRENCY,
            "wall_s": round(time.perf_counter() - started, 3),
        }
        json_out.write_text(json.dumps({"settings": settings, "sources": by_source}, indent=1))


if __name__ == "__main__":
    typer.run(main)
