"""How much AL a better choice among the index's drafts could add, measured in hindsight.

    python benchmarks/choice_headroom.py --data data/trajectories-dev.jsonl.gz [--limit 40] [--json FILE]

At every decoding step the index drafts from each level that holds text (the call's
stream, the session's seeds, the group, the global corpus) and keeps the draft with the
highest calibrated score. Any chooser, however it predicts, picks among those same drafts.
This replays the same calls through:

- ``agentspec``: the index as the server runs it;
- ``hindsight-level``: the same index, but each step takes the level whose draft the
  target accepts furthest (known from the recorded output), cut just past what is
  accepted: the ceiling of any chooser among levels under the index's draft policy;
- ``hindsight-long``: the same with longer drafts (factor 8, no probability floor): the
  ceiling of a chooser that also sets draft lengths;
- ``oracle``: the tree oracle (every branch of one tree over all the server's text, chosen
  in hindsight), the ceiling of what the index holds.

and prints AL ratios to vllm-suffix. The distance from ``hindsight-long`` to ``oracle`` is
what only another branch of a tree (not the most frequent continuation) can draft.

``--json FILE`` also writes the run: its settings (the data file by name only), and per
source each proposer's AL and its ratio to vllm-suffix and to agentspec (docs/policy.md
quotes them from ``benchmarks/results/dev-choice-headroom.json``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from agentspec.driver import TokenSeed
from agentspec.index.policy import DraftPolicy
from agentspec.replay import ProposerSettings, ReplayConfig, replay_workloads
from agentspec.replay.calls import CallSpec, SourceWorkload
from agentspec.replay.driver_proposer import DriverProposer, make_agentspec_index
from agentspec.replay.proposer import EMPTY_DRAFT, ReplayDraft
from agentspec.replay.simulate import accept_linear
from agentspec.replay.tokenized import TokenCache

LONG = DraftPolicy(max_spec_factor=8.0, min_token_prob=0.0)
PROPOSERS = ("vllm-suffix", "agentspec", "hindsight-level", "hindsight-long", "oracle")
console = Console(width=None if sys.stdout.isatty() else 200)


class HindsightChooser(DriverProposer):
    """The index's drafts at every level; the one the recorded output accepts furthest."""

    def __init__(self, settings: ProposerSettings, truth: dict[str, list[int]], policy: DraftPolicy | None) -> None:
        super().__init__(make_agentspec_index(settings))
        self._truth = truth
        self._policy = policy
        self._prompt_len: dict[str, int] = {}

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        self._prompt_len[call.call_id] = len(prompt)
        super().begin_call(call, prompt, seeds)

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        output = self._truth[call_id]
        pos = len(context) - self._prompt_len[call_id]
        best: list[int] = []
        best_accepted = -1
        for draft in self.index.level_drafts(call_id, self._policy):
            accepted = accept_linear(draft.token_ids, output, pos)
            if accepted > best_accepted:
                # The shortest draft with this outcome: what is accepted and one token more.
                best, best_accepted = list(draft.token_ids[: accepted + 1]), accepted
        return ReplayDraft(best) if best else EMPTY_DRAFT

    def end_call(self, call_id: str) -> None:
        self._prompt_len.pop(call_id, None)
        super().end_call(call_id)


def _replay(source: str, workload: SourceWorkload) -> dict[str, float]:
    truth = {call.spec.call_id: call.output().tolist() for trajectory in workload for call in trajectory}
    extra = {
        "hindsight-level": lambda s: HindsightChooser(s, truth, None),
        "hindsight-long": lambda s: HindsightChooser(s, truth, LONG),
    }
    config = ReplayConfig(proposers=PROPOSERS)
    (result,) = replay_workloads(config, {source: workload}, proposers=extra)
    return {name: t.output_tokens / t.steps if t.steps else 1.0 for name, t in result.tallies.items()}


def main(
    data: Annotated[Path, typer.Option(help="Trajectories file (.jsonl[.gz]).")],
    limit: Annotated[int, typer.Option(help="At most N trajectories per source.")] = 40,
    source: Annotated[list[str] | None, typer.Option(help="Sources to replay (default: all).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the figures here.")] = None,
) -> None:
    started = time.perf_counter()
    cache = TokenCache(data)
    sources = source or list(cache.sources())
    cache.ensure(sources)
    table = Table(title=f"AL / vllm-suffix, {limit} trajectories per source, one server")
    for col in ("source", "AL suffix", *(f"{p}" for p in PROPOSERS[1:])):
        table.add_column(col, justify="left" if col == "source" else "right")
    totals: dict[str, list[float]] = {p: [] for p in PROPOSERS}
    by_source: dict[str, dict[str, dict[str, float]]] = {}
    for name in sources:
        al = _replay(name, cache.load(name).workload(limit))
        by_source[name] = {
            "al": al,
            "vs_vllm_suffix": {p: al[p] / al["vllm-suffix"] for p in PROPOSERS},
            "vs_agentspec": {p: al[p] / al["agentspec"] for p in PROPOSERS},
        }
        base = al["vllm-suffix"]
        for p in PROPOSERS:
            totals[p].append(al[p] / base)
        table.add_row(name, f"{base:.3f}", *(f"{al[p] / base:.3f}" for p in PROPOSERS[1:]))
        console.print(f"{name}: " + ", ".join(f"{p} {al[p]:.3f}" for p in PROPOSERS), highlight=False)
    table.add_row("mean of sources", "", *(f"{float(np.mean(totals[p])):.3f}" for p in PROPOSERS[1:]), style="bold")
    console.print(table)
    if json_out is not None:
        doc = {
            "settings": {
                "data": data.name,
                "sources": sources,
                "limit": limit,
                "wall_s": round(time.perf_counter() - started, 3),
            },
            "sources": by_source,
            "mean_of_sources_vs_vllm_suffix": {p: float(np.mean(totals[p])) for p in PROPOSERS},
        }
        json_out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    typer.run(main)
