"""``agentspec bench``: the replay benchmark's command line (registered by agentspec.cli)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console

from agentspec._extras import missing_message
from agentspec.index.policy import DraftPolicy
from agentspec.replay.config import DEFAULT_PROPOSERS, ReplayConfig, parse_routing
from agentspec.replay.cost import CostModel
from agentspec.replay.settings import DrafterReplaySettings, ProposerSettings

# The options above import without the ``bench`` extra (so ``agentspec --help`` and
# ``agentspec bench --help`` work in the base install); the benchmark itself is imported
# when the command runs.
if TYPE_CHECKING:
    from agentspec.replay.hybrid_share import ShareCounts
    from agentspec.replay.simulate import SourceResult


def _csv(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    return items or None


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: agentspec bench: {message}", err=True)
    raise typer.Exit(2)


#: What a replay with a trained drafter compares by default.
DRAFTER_PROPOSERS = ("none", "vllm-suffix", "drafter", "agentspec", "agentspec-hybrid-arctic", "agentspec-hybrid")


def _drafter_settings(
    drafter: Path | None, target: Path | None, tokens: int, device: str
) -> DrafterReplaySettings | None:
    """The drafter's settings, checked from its files alone (before torch is imported)."""
    if drafter is None:
        if target is not None:
            _fail("--target is the model a --drafter drafts for: give --drafter DIR too")
        return None
    if target is None:
        _fail("--drafter needs --target DIR: the head drafts from that model's hidden states")
    for option, folder in (("--drafter", drafter), ("--target", target)):
        if not folder.is_dir():
            _fail(f"{option}: no such folder: {folder}")
    from agentspec.head.files import check_pair

    try:
        check_pair(drafter, target)
    except ValueError as e:
        _fail(f"--drafter: {e}")
    if (missing := missing_message("train")) is not None:
        typer.echo(f"error: agentspec bench: --drafter: {missing}", err=True)
        raise typer.Exit(1)
    return DrafterReplaySettings(head=drafter, target=target, tokens=tokens, device=device)


def bench(
    data: Annotated[
        Path | None,
        typer.Option(help="Trajectories file (.jsonl[.gz]). Default: the bundled slice.", dir_okay=False),
    ] = None,
    sources: Annotated[str | None, typer.Option(help="Comma list of sources (default: all).")] = None,
    # Counts show as N (typer's own label for a bounded int reads "<int range>").
    limit: Annotated[int | None, typer.Option(help="At most N trajectories per source.", min=1, metavar="N")] = None,
    proposers: Annotated[
        str | None,
        typer.Option(
            help=f"Comma list of proposers to compare (default: {','.join(DEFAULT_PROPOSERS)}; with --drafter:"
            f" {','.join(DRAFTER_PROPOSERS)})."
        ),
    ] = None,
    replicas: Annotated[int, typer.Option(help="Simulated servers, each with its own index.", min=1, metavar="N")] = 1,
    routing: Annotated[
        str,
        typer.Option(
            help="spread|session|group|client, or per proposer: 'agentspec=group,vllm-suffix=spread'."
            " 'auto': group for agentspec and oracle, spread for the vLLM baselines; client: pinned as the"
            " session-aware client pins groups."
        ),
    ] = "auto",
    exchange: Annotated[
        bool,
        typer.Option(
            "--exchange",
            metavar="",
            help="Replicas exchange finished outputs into each other's global corpus (agentspec's"
            " --agentspec-exchange-dir / --agentspec-exchange); proposers that cannot are unaffected.",
        ),
    ] = False,
    exchange_lag: Annotated[
        int,
        typer.Option(
            "--exchange-lag",
            help="With --exchange: outputs reach the other replicas N calls after theirs ended"
            " (delivery delay; 0: at once).",
            min=0,
            metavar="N",
        ),
    ] = 0,
    window: Annotated[
        int | None,
        typer.Option(
            help="Condenser emulation: keep system + task + recent messages within N tokens.", min=1, metavar="N"
        ),
    ] = None,
    seed_dropped: Annotated[
        bool,
        typer.Option(
            "--seed-dropped",
            metavar="",
            help="Condenser seeding: what --window drops is seeded into the session (prior_turn).",
        ),
    ] = False,
    concurrency: Annotated[
        int, typer.Option(help="Trajectories in flight (turns interleaved).", min=1, metavar="N")
    ] = 8,
    lockstep: Annotated[
        bool,
        typer.Option(
            "--lockstep",
            metavar="",
            help="The calls in flight decode a step each in turn, as one server batch does (siblings in flight"
            " draft from each other's partial outputs; agentspec's drafts capped by the server's default batch"
            " budget), not one whole call after another.",
        ),
    ] = False,
    jobs: Annotated[int, typer.Option(help="Replay sources in N parallel processes.", min=1, metavar="N")] = 1,
    baseline: Annotated[
        str | None,
        typer.Option(help="Proposer the table's ratios refer to (default: vllm-suffix when compared, else the first)."),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write records as JSON here.", dir_okay=False)
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write an AL bar chart (PNG) here.", dir_okay=False)] = None,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Token cache (default ~/.cache/agentspec/replay).", file_okay=False)
    ] = None,
    step_ms: Annotated[float, typer.Option(help="Cost model: one target decoding step, ms.")] = CostModel().step_ms,
    draft_token_ms: Annotated[
        float, typer.Option(help="Cost model: extra ms per verified draft token.")
    ] = CostModel().draft_token_ms,
    cost_profile: Annotated[
        Path | None,
        typer.Option(
            help="A server's measured step cost (agentspec serve --agentspec-cost-profile FILE): the cost model"
            " becomes that machine's (in place of --step-ms and --draft-token-ms), and agentspec's drafts are"
            " cut where that server's cost budget cuts them.",
            dir_okay=False,
            metavar="FILE",
        ),
    ] = None,
    ngram_k: Annotated[int, typer.Option(help="vllm-ngram: num_speculative_tokens.")] = ProposerSettings().ngram_k,
    ngram_min: Annotated[int, typer.Option(help="vllm-ngram: prompt_lookup_min.")] = ProposerSettings().ngram_min,
    ngram_max: Annotated[int, typer.Option(help="vllm-ngram: prompt_lookup_max.")] = ProposerSettings().ngram_max,
    ngram_impl: Annotated[
        str, typer.Option(help="vllm-ngram: 'auto' (vLLM's function if importable), 'vllm' or 'numpy'.")
    ] = "auto",
    agentspec_policy: Annotated[
        str | None,
        typer.Option(
            help="agentspec: draft policy as JSON, e.g. '{\"max_spec_factor\": 4}' (DraftPolicy fields).",
            metavar="JSON",
        ),
    ] = None,
    speed_model: Annotated[
        list[str] | None,
        typer.Option(
            help="Also estimate tokens/s at concurrency 1-128 on GPU:MODEL (GPU h100 or h200; MODEL 8b, 32b or "
            "70b), from a roofline of the engine (docs/speed.md). Repeat for several.",
            metavar="GPU:MODEL",
        ),
    ] = None,
    hybrid_share: Annotated[
        bool,
        typer.Option(
            "--hybrid-share",
            metavar="",
            help="Then replay agentspec again, counting the steps where its index has no confident draft"
            " (what a model drafter beside it could draft; no drafter runs), and print their shares"
            " (docs/bench.md).",
        ),
    ] = False,
    drafter: Annotated[
        Path | None,
        typer.Option(
            help="A trained EAGLE-3 head (agentspec train-drafter's output) for the proposers 'drafter' (the"
            " head alone) and 'agentspec-hybrid' (the index with the head beside it; '-arctic': by Arctic"
            " Inference's rule); the calls are replayed in the target's tokens. Needs --target.",
            metavar="DIR",
            file_okay=False,
        ),
    ] = None,
    target: Annotated[
        Path | None,
        typer.Option(
            help="With --drafter: the target model's folder the head drafts for.", metavar="DIR", file_okay=False
        ),
    ] = None,
    drafter_tokens: Annotated[
        int, typer.Option(help="With --drafter: tokens the head drafts per step.", min=1, max=16, metavar="N")
    ] = 3,
    device: Annotated[str, typer.Option(help="With --drafter: where the target and head run (cpu, cuda:0).")] = "cpu",
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Replay in this Hugging Face tokenizer's tokens (a model folder). Default: Qwen2.5's, or"
            " --target's with --drafter.",
            metavar="DIR",
            file_okay=False,
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.", metavar="")] = False,
) -> None:
    """Replay recorded agent trajectories through draft proposers and compare them."""
    console = Console()
    if (missing := missing_message("bench")) is not None:
        typer.echo(f"error: agentspec bench: {missing}", err=True)
        raise typer.Exit(1)
    from agentspec.draft_budget.speed_model import parse_speed_model
    from agentspec.draft_budget.step_cost import read_cost_profile

    # Inputs are checked before the benchmark's heavy imports (the tokenizer, the index,
    # vLLM's n-gram function): a mistake is reported at once.
    if data is not None and not data.is_file():
        _fail(f"--data: no such file: {data}")
    drafter_settings = _drafter_settings(drafter, target, drafter_tokens, device)
    if tokenizer is not None and not tokenizer.is_dir():
        _fail(f"--tokenizer: no such folder: {tokenizer}")
    if proposers is None:
        proposers = ",".join(DRAFTER_PROPOSERS if drafter_settings is not None else DEFAULT_PROPOSERS)
    try:
        profile = read_cost_profile(cost_profile) if cost_profile is not None else None
        speeds = [parse_speed_model(spec) for spec in speed_model or ()]
        default_routing, per_proposer = (None, {}) if routing == "auto" else parse_routing(routing)
        config = ReplayConfig(
            data=data,
            sources=_csv(sources),
            limit=limit,
            proposers=_csv(proposers) or DEFAULT_PROPOSERS,
            replicas=replicas,
            routing=per_proposer,
            default_routing=default_routing,
            exchange=exchange,
            exchange_lag=exchange_lag,
            window=window,
            seed_dropped=seed_dropped,
            concurrency=concurrency,
            lockstep=lockstep,
            jobs=jobs,
            cache_dir=cache_dir,
            tokenizer=tokenizer,
            baseline=baseline,
            proposer_settings=ProposerSettings(
                ngram_k=ngram_k,
                ngram_min=ngram_min,
                ngram_max=ngram_max,
                ngram_impl=ngram_impl,  # type: ignore[arg-type]
                agentspec_policy=DraftPolicy.model_validate_json(agentspec_policy) if agentspec_policy else None,
                drafter=drafter_settings,
                cost_profile=profile,
            ),
            cost=CostModel.from_profile(profile, concurrency if lockstep else 1)
            if profile is not None
            else CostModel(step_ms=step_ms, draft_token_ms=draft_token_ms),
        )
    except ValidationError as e:
        _fail("; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors()))
    except ValueError as e:
        _fail(str(e))

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    from agentspec.replay.report import (
        print_report,
        print_speed_table,
        write_json,
        write_plot,
    )
    from agentspec.replay.run import run_replay

    if drafter_settings is not None:
        # The command's own bars say what happens; not one per file transformers loads.
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        transformers_logging.set_verbosity_error()

    def make_progress() -> Progress:
        return Progress(
            TextColumn("{task.description:<24}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=quiet,
            transient=True,
        )

    progress = make_progress()
    tasks: dict[str, TaskID] = {}

    def on_start(source: str, calls: int) -> None:
        tasks[source] = progress.add_task(source, total=calls)

    def on_call(source: str) -> None:
        progress.advance(tasks[source])

    def on_done(res: SourceResult) -> None:
        task = tasks[res.source]
        progress.update(task, completed=progress.tasks[task].total)

    def on_tokenized(source: str) -> None:
        progress.console.log(f"tokenized and cached {source}")

    try:
        with progress:
            result = run_replay(
                config,
                on_tokenized=on_tokenized,
                on_start=on_start,
                on_call=on_call,
                on_source_done=on_done,
            )
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    except (EOFError, OSError, zlib.error) as e:
        # A truncated or corrupt gzip (click would turn EOFError into a bare "Aborted.").
        _fail(f"cannot read {config.data_path()}: {e or type(e).__name__} (a truncated or corrupt file?)")
    if not sum(result.trajectories.values()):
        where = f" of sources {', '.join(config.sources)}" if config.sources else ""
        _fail(f"{config.data_path()} holds no trajectories{where}")

    print_report(result, console, config.baseline)
    tables = []
    if speeds:
        from agentspec.replay.speed_table import MeasuredOn, speed_table

        try:
            measured_on = MeasuredOn.now(own_processes=config.jobs)
            tables = [speed_table(result, speed, measured_on=measured_on) for speed in speeds]
        except ValueError as e:
            _fail(str(e))
        for table in tables:
            print_speed_table(table, console, config.baseline)
    shares: dict[str, ShareCounts] | None = None
    if hybrid_share:
        from agentspec.replay.hybrid_share import print_share_table, run_share

        share_progress = make_progress()
        share_tasks: dict[str, TaskID] = {}

        def on_share_start(source: str, calls: int) -> None:
            share_tasks[source] = share_progress.add_task(f"{source} (share)", total=calls)

        def on_share_call(source: str) -> None:
            share_progress.advance(share_tasks[source])

        def on_share_done(source: str, _: ShareCounts) -> None:
            task = share_tasks[source]
            share_progress.update(task, completed=share_progress.tasks[task].total)

        with share_progress:
            shares = run_share(config, on_start=on_share_start, on_call=on_share_call, on_source_done=on_share_done)
        print_share_table(console, shares, config.limit, config.replicas)
    if json_path is not None:
        write_json(result, json_path, tables)
        if shares is not None:
            from agentspec.replay.hybrid_share import add_share_json

            add_share_json(json_path, shares)
        console.print(f"wrote {json_path}")
    if plot is not None:
        write_plot(result, plot)
        console.print(f"wrote {plot}")
