"""Where the draft index's time per call goes, against vLLM's suffix method, on one source.

    python benchmarks/index_cost.py --data data/trajectories-dev.jsonl.gz [--source mini_swe_agent] [--limit 4]
        [--json FILE]

1. Index time per call (everything but drafting: start, every step's new tokens, finish),
   agentspec at several tree depths and vllm-suffix (vLLM's defaults), replayed on the same
   calls in one process, as ratios agentspec / vllm-suffix.
2. The prompt side of it: how many prompt tokens a call brings and how many of them are new
   to its session, and what one token costs to index in the session's tree against what it
   costs in a fresh tree over one prompt (what vLLM's suffix method builds at every call).

Run it on an idle machine: the figures are times.

``--json FILE`` also writes the run: its settings (the data file by name only, and the
machine's CPUs and load average when it ended), each policy's index time per call for both
proposers with their ratio, and the prompt side (docs/policy.md quotes them from
``benchmarks/results/dev-index-cost.json``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from arctic_inference.suffix_decoding._C import SuffixTree
from rich.console import Console
from rich.table import Table

from agentspec.index import DraftIndex
from agentspec.index.policy import DraftPolicy, IndexConfig
from agentspec.replay import ProposerSettings, ReplayConfig, replay_workloads
from agentspec.replay.calls import SourceWorkload
from agentspec.replay.tokenized import TokenCache

DEPTHS: list[dict[str, int]] = [{}, {"max_depth": 48}, {"max_depth": 32, "max_match_tokens": 16}]


def _per_call_index_us(workload: SourceWorkload, source: str, policy: DraftPolicy) -> tuple[float, float]:
    config = ReplayConfig(
        proposers=("vllm-suffix", "agentspec"), proposer_settings=ProposerSettings(agentspec_policy=policy)
    )
    (res,) = replay_workloads(config, {source: workload})
    ours, base = res.tallies["agentspec"], res.tallies["vllm-suffix"]
    return ours.index_ns / 1e3 / ours.calls, base.index_ns / 1e3 / base.calls


def _prompt_side(workload: SourceWorkload) -> dict[str, float]:
    index = DraftIndex()
    prompt_tokens = new_tokens = start_ns = 0
    calls = 0
    fresh_ns = {24: 0, 64: 0}
    for trajectory in workload:
        for call in trajectory:
            spec, prompt = call.spec, call.prompt()
            t0 = time.perf_counter_ns()
            started = index.start_call(spec.call_id, prompt, session_id=spec.session_id, group_id=spec.group_id)
            start_ns += time.perf_counter_ns() - t0
            index.extend_call(spec.call_id, call.output())
            index.finish_call(spec.call_id)
            prompt_tokens += len(prompt)
            new_tokens += started.new_tokens
            calls += 1
            for depth in fresh_ns:  # a tree over the whole prompt, built anew
                tree = SuffixTree(depth)
                t0 = time.perf_counter_ns()
                tree.extend_ndarray(0, np.ascontiguousarray(prompt, dtype=np.int32))
                fresh_ns[depth] += time.perf_counter_ns() - t0
    return {
        "calls": calls,
        "prompt": prompt_tokens / calls,
        "new": new_tokens / calls,
        "session_us_per_token": start_ns / 1e3 / max(new_tokens, 1),
        **{f"fresh{d}_us_per_token": ns / 1e3 / prompt_tokens for d, ns in fresh_ns.items()},
    }


def main(
    data: Annotated[Path, typer.Option(help="Trajectories file (.jsonl[.gz]).")],
    source: Annotated[str, typer.Option(help="Source to replay.")] = "mini_swe_agent",
    limit: Annotated[int, typer.Option(help="Trajectories of the source.")] = 4,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    console = Console(width=None if sys.stdout.isatty() else 160)
    started = time.perf_counter()
    cache = TokenCache(data)
    cache.ensure([source])
    workload = cache.load(source).workload(limit, None)

    table = Table(title=f"index time per call, {source}, {limit} trajectories")
    for col in ("agentspec policy", "agentspec µs/call", "vllm-suffix µs/call", "ratio"):
        table.add_column(col, justify="left" if col == "agentspec policy" else "right")
    rows: list[dict[str, object]] = []
    for overrides in DEPTHS:
        ours, base = _per_call_index_us(workload, source, DraftPolicy(**overrides))
        label = ", ".join(f"{k}={v}" for k, v in overrides.items()) or "defaults"
        table.add_row(label, f"{ours:.0f}", f"{base:.0f}", f"1/{base / ours:.1f}")
        rows.append(
            {
                "policy": overrides,
                "agentspec_us_per_call": ours,
                "vllm_suffix_us_per_call": base,
                "vllm_suffix_over_agentspec": base / ours,
            }
        )
    console.print(table)

    side = _prompt_side(workload)
    console.print(
        f"prompt side: {side['prompt']:.0f} prompt tokens per call, {side['new']:.0f} new to the session "
        f"(1/{side['prompt'] / max(side['new'], 1):.1f}); indexing a new token in the session's tree "
        f"(depth {IndexConfig().policy.max_depth}) {side['session_us_per_token']:.2f} µs; a fresh tree over "
        f"the whole prompt {side['fresh24_us_per_token']:.2f} µs per token at depth 24, "
        f"{side['fresh64_us_per_token']:.2f} at depth 64"
    )
    if json_out is not None:
        try:
            load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
        except (AttributeError, OSError):
            load = None
        doc = {
            "settings": {
                "data": data.name,
                "source": source,
                "limit": limit,
                "session_depth": IndexConfig().policy.max_depth,
                "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                "load_average": load,
                "wall_s": round(time.perf_counter() - started, 3),
            },
            "index_per_call": rows,
            "prompt_side": side,
        }
        json_out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    typer.run(main)
