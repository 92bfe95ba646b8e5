"""Sweep the draft policy on a recorded trajectory set: AL and acceptance against vLLM's suffix.

    python benchmarks/policy_sweep.py --data data/trajectories-dev.jsonl.gz --limit 20 [--json FILE]

vllm-suffix (vLLM's defaults) is replayed once; every policy in POLICIES is replayed through
the agentspec proposer on the same calls (one server). Prints, per policy, the AL ratio
agentspec / vllm-suffix over all calls, the lowest AL ratio of any source, and the
acceptance-rate ratio of each source and of all calls (the target keeps every source's above
2/3).

``--json FILE`` also writes the run: its settings (the data file by name only), vllm-suffix's
records and, per policy, its overrides of ``DraftPolicy`` and agentspec's records (per
source and ``all``: calls, steps, output, drafted and accepted tokens, AL and acceptance
rate) with the ratios the table shows. docs/policy.md's sweep table is made from such a file
(``benchmarks/results/dev-policy-sweep.json``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentspec.index.policy import DraftPolicy
from agentspec.replay import ProposerSettings, ReplayConfig, run_replay
from agentspec.replay.run import ALL, ReplayResult

POLICIES: list[dict[str, float | bool]] = [
    {"max_spec_factor": 4.0, "min_token_prob": 0.1},
    {},  # the defaults
    {"min_token_prob": 0.25},
    {"min_token_prob": 0.3},
    {"calibrate_levels": False},
    {"calibrate_levels": False, "min_token_prob": 0.3},
    {"max_spec_factor": 1.0, "min_token_prob": 0.1},
    {"max_depth": 40, "max_match_tokens": 20},
    {"max_depth": 32, "max_match_tokens": 16},
    {"max_depth": 32, "max_match_tokens": 16, "min_token_prob": 0.25},
]
#: The fields of a replay's record that the JSON keeps (not its draft outcomes).
FIELDS = ("calls", "steps", "output_tokens", "drafted_tokens", "accepted_tokens", "al", "acceptance_rate")


def _records(result: ReplayResult, proposer: str) -> dict[str, dict[str, Any]]:
    return {s: {f: getattr(result.record(proposer, s), f) for f in FIELDS} for s in result.sources()}


def main(
    data: Annotated[Path, typer.Option(help="Trajectories file (.jsonl[.gz]).")],
    sources: Annotated[str, typer.Option(help="Comma list of sources.")] = (
        "tau_bench,openhands_mocks,tot,codet,mini_swe_agent"
    ),
    limit: Annotated[int, typer.Option(help="At most N trajectories per source.")] = 20,
    jobs: Annotated[int, typer.Option(help="Sources replayed in parallel processes.")] = 1,
    policy: Annotated[
        list[str] | None,
        typer.Option(help="A policy to replay, as JSON of DraftPolicy overrides (repeatable); default: POLICIES."),
    ] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the sweep's figures here.")] = None,
) -> None:
    # Wide tables when written to a file or pipe (rich assumes 80 columns there).
    console = Console(width=None if sys.stdout.isatty() else 200)
    started = time.perf_counter()
    common = dict(data=data, sources=tuple(sources.split(",")), limit=limit, jobs=jobs)
    base = run_replay(ReplayConfig(**common, proposers=("vllm-suffix",)))
    names = [s for s in base.sources() if s != ALL]
    table = Table(title=f"agentspec / vllm-suffix, {limit} trajectories per source")
    columns = ["policy", "AL ratio (all)", "lowest AL ratio", *[f"acc ratio {s}" for s in names], "acc ratio all"]
    for col in columns:
        table.add_column(col, justify="left" if col == "policy" else "right")
    rows: list[dict[str, Any]] = []
    for overrides in [json.loads(p) for p in policy] if policy else POLICIES:
        settings = ProposerSettings(agentspec_policy=DraftPolicy(**overrides))
        result = run_replay(ReplayConfig(**common, proposers=("agentspec",), proposer_settings=settings))
        label = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "defaults"
        al = {s: result.record("agentspec", s).al / base.record("vllm-suffix", s).al for s in [*names, ALL]}
        acc = {
            s: result.record("agentspec", s).acceptance_rate / base.record("vllm-suffix", s).acceptance_rate
            for s in [*names, ALL]
        }
        lowest = min(al[s] for s in names)
        table.add_row(label, f"{al[ALL]:.3f}", f"{lowest:.3f}", *[f"{acc[s]:.2f}" for s in [*names, ALL]])
        rows.append(
            {
                "policy": overrides,
                "al_ratio": al,
                "lowest_al_ratio": lowest,
                "acceptance_ratio": acc,
                "records": _records(result, "agentspec"),
            }
        )
    console.print(table)
    if json_out is not None:
        doc = {
            "settings": {
                "data": data.name,
                "sources": names,
                "limit": limit,
                "trajectories": base.trajectories,
                "defaults": DraftPolicy().model_dump(),
                "wall_s": round(time.perf_counter() - started, 3),
            },
            "baseline": {"proposer": "vllm-suffix", "records": _records(base, "vllm-suffix")},
            "policies": rows,
        }
        json_out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    typer.run(main)
