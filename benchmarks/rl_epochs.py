"""RL epochs: the same prompts sampled again, with the last epoch's outputs kept or retired.

    python benchmarks/rl_epochs.py --data data/trajectories-dev.jsonl.gz [--sources codet,tot] [--limit N]
        [--arms vllm-suffix,kept,retired] [--json FILE]

Each source's recorded sibling groups (GRPO-like: several samples of one prompt) are
replayed twice through one agentspec server, the engine's own request driver and index,
then through vLLM's suffix method for reference. Epoch 2 samples the same prompts as new
groups (a rollout library names a new group per ``generate``), so the first epoch's
outputs reach it only through the global corpus. Between the epochs the trainer announces
a weight update (``RequestDriver.set_policy_version``, what ``POST /agentspec/v1/policy``
does): with ``keep_old_outputs`` the first epoch's outputs stay draftable, without it they
are retired. The table prints epoch 2's AL (output tokens per decoding step) each way and
their ratio.

The ratio is an upper bound of what keeping old outputs is worth: the recorded epoch 2 is
the same samples again, with no policy drift between the epochs, so old outputs are exactly
right here; after a real update they are only similar.

``--arms`` replays some of the three only (each replays on a server of its own, so a run of
each gives the figures of a run of all three).

``--json FILE`` also writes the run: its settings (the data file by name only) and, per
source, the groups replayed, epoch 2's AL each way and the ratio kept / retired.
"""

from __future__ import annotations

import dataclasses
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
from agentspec.replay.calls import SourceWorkload, static_call
from agentspec.replay.driver_proposer import DriverProposer, make_agentspec_index
from agentspec.replay.proposer import Proposer
from agentspec.replay.simulate import Tally, interleave, replay_call
from agentspec.replay.tokenized import TokenCache

CONCURRENCY = 8
#: The arms (``--arms``) and the names the table and the JSON give them.
ARMS = {"vllm-suffix": "vllm-suffix", "kept": "agentspec, kept", "retired": "agentspec, retired"}


def next_epoch(workload: SourceWorkload, epoch: int) -> SourceWorkload:
    """The same prompts and outputs as new samples in new groups."""
    tag = f"@epoch{epoch}"
    out: SourceWorkload = []
    for trajectory in workload:
        calls = []
        for call in trajectory:
            spec = dataclasses.replace(
                call.spec,
                call_id=call.spec.call_id + tag,
                session_id=call.spec.session_id + tag,
                group_id=call.spec.group_id + tag,
            )
            calls.append(static_call(spec, call.prompt(), call.output()))
        out.append(calls)
    return out


def replay(proposer: Proposer, workload: SourceWorkload) -> Tally:
    tally = Tally()
    for call in interleave(workload, CONCURRENCY):
        output = call.output()
        replay_call(proposer, call.spec, call.prompt(), output, output.tolist(), tally)
    return tally


def epoch_two_al(make: Callable[[], Proposer], workload: SourceWorkload, between: Callable[[Proposer], None]) -> float:
    """AL of the second epoch on one server that replayed the first."""
    server = make()
    replay(server, workload)
    between(server)
    tally = replay(server, next_epoch(workload, 2))
    return tally.output_tokens / tally.steps


def _agentspec() -> Proposer:
    return DriverProposer(make_agentspec_index(ProposerSettings()))


def _update(keep: bool) -> Callable[[Proposer], None]:
    def announce(server: Proposer) -> None:
        assert isinstance(server, DriverProposer)
        server.driver.set_policy_version(1, keep_old_outputs=keep)

    return announce


def main(
    data: Annotated[Path, typer.Option(help="Trajectories file (.jsonl[.gz]).")],
    sources: Annotated[str, typer.Option(help="Sources with sibling samples, comma-separated.")] = "codet,tot",
    limit: Annotated[int | None, typer.Option(help="Trajectories (groups) per source.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Token cache (default ~/.cache/agentspec/replay).")] = None,
    arms: Annotated[str, typer.Option(help="Arms to replay, comma-separated.")] = "vllm-suffix,kept,retired",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the run's figures here.")] = None,
) -> None:
    started = time.perf_counter()
    unknown = set(arms.split(",")) - set(ARMS)
    chosen = [ARMS[a] for a in ARMS if a in arms.split(",")]
    if unknown or not chosen:
        raise typer.BadParameter(f"arms are {', '.join(ARMS)}, not {sorted(unknown) or arms!r}")
    runs: dict[str, tuple[Callable[[], Proposer], Callable[[Proposer], None]]] = {
        "vllm-suffix": (VllmSuffixTreeProposer, lambda _: None),
        "agentspec, kept": (_agentspec, _update(keep=True)),
        "agentspec, retired": (_agentspec, _update(keep=False)),
    }
    both = "agentspec, kept" in chosen and "agentspec, retired" in chosen
    cache = TokenCache(data, cache_dir)
    names = [s for s in sources.split(",") if s]
    cache.ensure(names)
    table = Table(
        "source", "groups", *chosen, *(["kept / retired"] if both else []),
        title="Epoch 2 AL after a weight update (upper bound: no policy drift)",
    )  # fmt: skip
    by_source: dict[str, Any] = {}
    for name in names:
        workload = cache.load(name).workload(limit, None)
        al = {arm: epoch_two_al(runs[arm][0], workload, runs[arm][1]) for arm in chosen}
        by_source[name] = {"groups": len(workload), "al": al}
        cells = [f"{al[arm]:.3f}" for arm in chosen]
        if both:
            ratio = al["agentspec, kept"] / al["agentspec, retired"]
            by_source[name]["kept_over_retired"] = ratio
            cells.append(f"{ratio:.2f}x")
        table.add_row(name, str(len(workload)), *cells)
    Console().print(table)
    if json_out is not None:
        settings = {
            "data": data.name,
            "sources": names,
            "limit": limit,
            "concurrency": CONCURRENCY,
            "wall_s": round(time.perf_counter() - started, 3),
        }
        json_out.write_text(json.dumps({"settings": settings, "sources": by_source}, indent=1))


if __name__ == "__main__":
    typer.run(main)
