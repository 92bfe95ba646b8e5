"""A fitted draft chooser against the index's calibrated score, on steps it was not fitted on.

    python benchmarks/chooser_fit.py --data data/trajectories-dev.jsonl.gz [--limit 40] [--record-every 4] [--json FILE]

Each source's trajectories are split in two by a hash of their group (or, without one, of
the trajectory), so that sibling samples stay on one side:

1. *fit*: the fit half is replayed through agentspec as the server runs it; at every
   ``record-every``-th step each level's candidate draft is recorded with its features and
   the tokens the recorded output accepts of it, and
   ``SurvivalChooser`` (survival_chooser.py, beside this script) is fitted to those steps;
2. *check*: the held half is replayed through vllm-suffix, agentspec (recording its steps
   the same way) and agentspec with the fitted chooser in place of the calibrated score.

It prints the fit (log-loss on fit and held steps; expected against accepted tokens of the
drafts the index chose on held steps), the choice on the same held steps (accepted tokens
when choosing by the model, by the calibrated score, and in hindsight), and AL and
acceptance ratios to vllm-suffix of both choosers replayed on the held half.

``--json FILE`` also writes those figures: the settings (the data file by name only), the
fit (steps, token events, log-loss on each half, the weights), the choice on the held steps
(accepted tokens by the calibrated score, the fitted model and in hindsight) and the held
half's replay (per source and ``all``: each proposer's output tokens, steps, drafted and
accepted tokens, AL and acceptance rate). docs/policy.md's figures on the fitted chooser
come from such a file (``benchmarks/results/dev-chooser-fit.json``).
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.table import Table
from survival_chooser import (
    FEATURES,
    SurvivalChooser,
    draft_features,
    survival_rows,
)

from agentspec.driver import TokenSeed
from agentspec.index import DraftIndex
from agentspec.index.choice import Candidate, ChoiceContext, by_calibrated_score
from agentspec.index.policy import IndexConfig
from agentspec.replay import ReplayConfig, replay_workloads
from agentspec.replay.calls import CallSpec, SourceWorkload
from agentspec.replay.driver_proposer import DriverProposer
from agentspec.replay.proposer import ReplayDraft
from agentspec.replay.simulate import SourceResult, accept_linear
from agentspec.replay.tokenized import TokenCache

BASE, OURS, FITTED = "vllm-suffix", "agentspec", "agentspec-fitted"
console = Console(width=None if sys.stdout.isatty() else 200)


@dataclass
class _Step:
    """One recorded step: each candidate's features and accepted tokens, and the default's pick."""

    features: list[np.ndarray]
    accepted: list[int]
    chosen: int


class _Recorder:
    """The index's default choice, keeping the candidates it chose among."""

    def __init__(self) -> None:
        self.last: tuple[Sequence[Candidate], ChoiceContext, int] | None = None

    def choose(self, candidates: Sequence[Candidate], context: ChoiceContext) -> int:
        chosen = by_calibrated_score(candidates)
        self.last = (candidates, context, chosen)
        return chosen


class _RecordingProposer(DriverProposer):
    """agentspec as the server runs it, recording every ``every``-th step's candidates."""

    def __init__(self, truth: dict[str, list[int]], every: int) -> None:
        self._recorder = _Recorder()
        super().__init__(DraftIndex(IndexConfig(), chooser=self._recorder))
        self._truth = truth
        self._every = every
        self._prompt_len: dict[str, int] = {}
        self._count = 0
        self.steps: list[_Step] = []

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        self._prompt_len[call.call_id] = len(prompt)
        super().begin_call(call, prompt, seeds)

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        self._recorder.last = None
        draft = super().propose(call_id, context)
        self._count += 1
        if self._recorder.last is not None and self._count % self._every == 0:
            candidates, ctx, chosen = self._recorder.last
            output, pos = self._truth[call_id], len(context) - self._prompt_len[call_id]
            accepted = [accept_linear(c.draft.token_ids, output, pos) for c in candidates]
            self.steps.append(_Step(draft_features(candidates, ctx), accepted, chosen))
        return draft

    def end_call(self, call_id: str) -> None:
        self._prompt_len.pop(call_id, None)
        super().end_call(call_id)


def _split(workload: SourceWorkload) -> tuple[SourceWorkload, SourceWorkload]:
    fit: SourceWorkload = []
    held: SourceWorkload = []
    for trajectory in workload:
        spec = trajectory[0].spec
        key = spec.group_id or spec.trajectory_id
        (held if zlib.crc32(key.encode()) % 2 else fit).append(trajectory)
    return fit, held


def _truth(workload: SourceWorkload) -> dict[str, list[int]]:
    return {call.spec.call_id: call.output().tolist() for trajectory in workload for call in trajectory}


def _record(source: str, workload: SourceWorkload, every: int) -> list[_Step]:
    made: list[_RecordingProposer] = []

    def factory(_settings: object) -> _RecordingProposer:
        made.append(_RecordingProposer(_truth(workload), every))
        return made[-1]

    replay_workloads(ReplayConfig(proposers=(OURS,)), {source: workload}, proposers={OURS: factory})
    return [step for p in made for step in p.steps]


def _replay_held(
    source: str, held: SourceWorkload, chooser: SurvivalChooser, every: int
) -> tuple[SourceResult, list[_Step]]:
    """The held half through vllm-suffix, agentspec (recording) and agentspec with ``chooser``."""
    made: list[_RecordingProposer] = []

    def recording(_settings: object) -> _RecordingProposer:
        made.append(_RecordingProposer(_truth(held), every))
        return made[-1]

    extra = {OURS: recording, FITTED: lambda _s: DriverProposer(DraftIndex(IndexConfig(), chooser=chooser))}
    (result,) = replay_workloads(ReplayConfig(proposers=(BASE, OURS, FITTED)), {source: held}, proposers=extra)
    return result, [step for p in made for step in p.steps]


def _events(steps: Sequence[_Step]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [survival_rows(f, a) for s in steps for f, a in zip(s.features, s.accepted, strict=True)]


def main(
    data: Annotated[Path, typer.Option(help="Trajectories file (.jsonl[.gz]).")],
    limit: Annotated[int, typer.Option(help="At most N trajectories per source (both halves).")] = 40,
    record_every: Annotated[int, typer.Option(min=1, help="Record one step in N.")] = 4,
    source: Annotated[list[str] | None, typer.Option(help="Sources (default: all).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Token cache (default ~/.cache/agentspec/replay).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the fit's figures here.")] = None,
) -> None:
    started = time.perf_counter()
    cache = TokenCache(data, cache_dir)
    sources = source or list(cache.sources())
    cache.ensure(sources)
    halves = {name: _split(cache.load(name).workload(limit)) for name in sources}

    for half, label in ((0, "fit"), (1, "held")):
        if not any(halves[name][half] for name in sources):
            raise typer.BadParameter(f"the split left the {label} half empty: replay more trajectories (--limit)")
    fit_steps = [s for name in sources for s in _record(name, halves[name][0], record_every)]
    fit_events = _events(fit_steps)
    chooser = SurvivalChooser.fit(fit_events)

    table = Table(title="held half: AL and acceptance / vllm-suffix")
    for col in ("source", "calls", "AL suffix", "agentspec", "fitted", "acc agentspec", "acc fitted"):
        table.add_column(col, justify="left" if col == "source" else "right")
    held_steps: list[_Step] = []
    totals = {p: np.zeros(4) for p in (BASE, OURS, FITTED)}  # output tokens, steps, accepted, drafted
    replayed: dict[str, dict[str, Any]] = {}
    for name in sources:
        held = halves[name][1]
        if not held:
            continue
        result, steps = _replay_held(name, held, chooser, record_every)
        held_steps += steps
        row = {}
        for p in (BASE, OURS, FITTED):
            t = result.tallies[p]
            totals[p] += (t.output_tokens, t.steps, t.accepted_tokens, t.drafted_tokens)
            row[p] = (t.output_tokens / t.steps, t.accepted_tokens / max(t.drafted_tokens, 1))
        calls = sum(len(t) for t in held)
        replayed[name] = {"calls": calls} | {p: _tally(_totals_of(result.tallies[p])) for p in (BASE, OURS, FITTED)}
        table.add_row(
            name,
            str(calls),
            f"{row[BASE][0]:.3f}",
            f"{row[OURS][0] / row[BASE][0]:.3f}",
            f"{row[FITTED][0] / row[BASE][0]:.3f}",
            f"{row[OURS][1] / row[BASE][1]:.3f}",
            f"{row[FITTED][1] / row[BASE][1]:.3f}",
        )
    al = {p: v[0] / v[1] for p, v in totals.items()}
    acc = {p: v[2] / max(v[3], 1) for p, v in totals.items()}
    replayed["all"] = {"calls": sum(r["calls"] for r in replayed.values())} | {p: _tally(v) for p, v in totals.items()}
    table.add_row(
        "all",
        "",
        f"{al[BASE]:.3f}",
        f"{al[OURS] / al[BASE]:.3f}",
        f"{al[FITTED] / al[BASE]:.3f}",
        f"{acc[OURS] / acc[BASE]:.3f}",
        f"{acc[FITTED] / acc[BASE]:.3f}",
        style="bold",
    )

    held_x, held_y = (np.concatenate(parts) for parts in zip(*_events(held_steps), strict=True))
    fit_x, fit_y = (np.concatenate(parts) for parts in zip(*fit_events, strict=True))
    chosen_expected = chosen_accepted = model_accepted = hindsight_accepted = 0.0
    for step in held_steps:
        expected = [chooser.expected_accepted(f) for f in step.features]
        chosen_expected += expected[step.chosen]
        chosen_accepted += step.accepted[step.chosen]
        model_accepted += step.accepted[int(np.argmax(expected))]
        hindsight_accepted += max(step.accepted)
    console.print(
        f"fit: {len(fit_steps):,} steps ({len(fit_y):,} token events), held: {len(held_steps):,} steps"
        f" ({len(held_y):,}); log-loss fit {chooser.log_loss(fit_x, fit_y):.4f}, held"
        f" {chooser.log_loss(held_x, held_y):.4f}; on held steps the index's chosen drafts were expected to"
        f" yield {chosen_expected:,.0f} accepted tokens and yielded {chosen_accepted:,.0f}",
        highlight=False,
    )
    console.print(
        "held steps, accepted tokens by choice (same steps, same candidates): calibrated score"
        f" {chosen_accepted:,.0f}; fitted model {model_accepted:,.0f} ({model_accepted / chosen_accepted:.3f}x);"
        f" hindsight {hindsight_accepted:,.0f} ({hindsight_accepted / chosen_accepted:.3f}x)",
        highlight=False,
    )
    console.print("weights: " + ", ".join(f"{n} {w:+.2f}" for n, w in zip(FEATURES, chooser.weights, strict=True)))
    console.print(table)
    if json_out is not None:
        doc = {
            "settings": {
                "data": data.name,
                "sources": sources,
                "limit": limit,
                "record_every": record_every,
                "trajectories": {name: [len(h) for h in halves[name]] for name in sources},
                "wall_s": round(time.perf_counter() - started, 3),
            },
            "fit": {
                "steps": len(fit_steps),
                "token_events": len(fit_y),
                "log_loss": chooser.log_loss(fit_x, fit_y),
                "weights": dict(zip(FEATURES, (float(w) for w in chooser.weights), strict=True)),
            },
            "held": {
                "steps": len(held_steps),
                "token_events": len(held_y),
                "log_loss": chooser.log_loss(held_x, held_y),
                "expected_by_calibrated_score": chosen_expected,
                "accepted": {
                    "calibrated_score": chosen_accepted,
                    "fitted_model": model_accepted,
                    "hindsight": hindsight_accepted,
                },
            },
            "replay": replayed,
        }
        json_out.write_text(json.dumps(doc, indent=1))


def _totals_of(tally: Any) -> np.ndarray:
    """A replay tally's output tokens, steps, accepted and drafted tokens."""
    return np.array([tally.output_tokens, tally.steps, tally.accepted_tokens, tally.drafted_tokens], dtype=float)


def _tally(v: np.ndarray) -> dict[str, float]:
    """The JSON's figures of one proposer's replay, from :func:`_totals_of`'s four sums."""
    output, steps, accepted, drafted = (int(x) for x in v)
    return {
        "output_tokens": output,
        "steps": steps,
        "accepted_tokens": accepted,
        "drafted_tokens": drafted,
        "al": output / steps if steps else 1.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
    }


if __name__ == "__main__":
    typer.run(main)
