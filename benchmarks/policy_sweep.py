"""Sweep the draft policy on a recorded trajectory set: AL and acceptance against vLLM's suffix.

    python benchmarks/policy_sweep.py --data trajectories-dev.jsonl.gz --limit 20

vllm-suffix (vLLM's defaults) is replayed once; every policy in POLICIES is replayed through
the agentspec proposer on the same calls (one server). Prints, per policy, the AL ratio
agentspec / vllm-suffix over all calls, the lowest AL ratio of any source, and the
acceptance-rate ratio of each source (the target keeps every one of them above 2/3).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentspec.index.policy import DraftPolicy
from agentspec.replay import ProposerSettings, ReplayConfig, run_replay

POLICIES: list[dict[str, float | bool]] = [
    {"max_spec_factor": 4.0, "min_token_prob": 0.1},
    {},  # the defaults
    {"min_token_prob": 0.25},
    {"min_token_prob": 0.3},
    {"calibrate_levels": False},
    {"calibrate_levels": False, "min_token_prob": 0.3},
    {"max_spec_factor": 1.0, "min_token_prob": 0.1},
    {"max_depth": 32, "max_match_tokens": 16},
]


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
) -> None:
    # Wide tables when written to a file or pipe (rich assumes 80 columns there).
    console = Console(width=None if sys.stdout.isatty() else 200)
    common = dict(data=data, sources=tuple(sources.split(",")), limit=limit, jobs=jobs)
    base = run_replay(ReplayConfig(**common, proposers=("vllm-suffix",)))
    names = base.sources()
    table = Table(title=f"agentspec / vllm-suffix, {limit} trajectories per source")
    for col in ["policy", "AL ratio (all)", "lowest AL ratio", *[f"acc ratio {s}" for s in names]]:
        table.add_column(col, justify="left" if col == "policy" else "right")
    for overrides in [json.loads(p) for p in policy] if policy else POLICIES:
        settings = ProposerSettings(agentspec_policy=DraftPolicy(**overrides))
        result = run_replay(ReplayConfig(**common, proposers=("agentspec",), proposer_settings=settings))
        label = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "defaults"
        al = result.record("agentspec").al / base.record("vllm-suffix").al
        lowest = min(result.record("agentspec", s).al / base.record("vllm-suffix", s).al for s in names)
        accs = [
            result.record("agentspec", s).acceptance_rate / base.record("vllm-suffix", s).acceptance_rate for s in names
        ]
        table.add_row(label, f"{al:.3f}", f"{lowest:.3f}", *[f"{a:.2f}" for a in accs])
    console.print(table)


if __name__ == "__main__":
    typer.run(main)
