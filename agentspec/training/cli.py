"""``agentspec train-drafter``: the command line of :mod:`agentspec.training` (registered by
agentspec.cli). Inputs are checked before torch is imported; a bad one is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from agentspec._extras import missing_message
from agentspec.training.config import DrafterTrainingConfig

_DEFAULTS = DrafterTrainingConfig.model_fields


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: agentspec train-drafter: {message}", err=True)
    raise typer.Exit(code)


def _option(field: str) -> str:
    return "--" + field.replace("_", "-")


def _layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        _fail(f"--aux-layers: a comma list of layer numbers, got {text!r}")


def train_drafter(
    target: Annotated[
        Path, typer.Argument(help="The target model's folder (Hugging Face layout, Llama).", metavar="TARGET")
    ],
    data: Annotated[
        list[Path],
        typer.Option(help="Trajectory file (.jsonl[.gz]) of your calls; repeat for several.", metavar="FILE"),
    ],
    out: Annotated[Path, typer.Option(help="Folder for the head (resumes a stopped run there).", metavar="DIR")],
    tenant: Annotated[
        str | None, typer.Option(help="Train on this tenant's trajectories only (their `tenant` field).")
    ] = None,
    all_tenants: Annotated[
        bool,
        typer.Option(
            "--all-tenants", metavar="", help="Allow several tenants' text in one drafter (it drafts it for all)."
        ),
    ] = False,
    draft_vocab: Annotated[
        int, typer.Option(help="Tokens the head drafts (the most frequent in the outputs).", metavar="N")
    ] = _DEFAULTS["draft_vocab"].default,
    aux_layers: Annotated[
        str | None, typer.Option(help="The target's layers the head reads, e.g. 2,15,27 (default: vLLM's).")
    ] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.", metavar="N")] = _DEFAULTS["steps"].default,
    passes: Annotated[int, typer.Option(help="Chained draft passes trained per position.", metavar="N")] = _DEFAULTS[
        "passes"
    ].default,
    batch_tokens: Annotated[int, typer.Option(help="Tokens per optimizer step.", metavar="N")] = _DEFAULTS[
        "batch_tokens"
    ].default,
    max_tokens: Annotated[
        int, typer.Option(help="Tokens per example (prompt tail and output).", metavar="N")
    ] = _DEFAULTS["max_tokens"].default,
    context_tokens: Annotated[
        int, typer.Option(help="Prompt tokens kept before each output.", metavar="N")
    ] = _DEFAULTS["context_tokens"].default,
    learning_rate: Annotated[float, typer.Option(help="AdamW's learning rate.")] = _DEFAULTS["learning_rate"].default,
    hard_below: Annotated[
        float, typer.Option(help="A step is the drafter's when the index expected fewer tokens than this.")
    ] = _DEFAULTS["hard_below"].default,
    easy_weight: Annotated[float, typer.Option(help="Loss weight of output tokens the index drafts well.")] = _DEFAULTS[
        "easy_weight"
    ].default,
    prompt_weight: Annotated[float, typer.Option(help="Loss weight of prompt tokens.")] = _DEFAULTS[
        "prompt_weight"
    ].default,
    eval_fraction: Annotated[float, typer.Option(help="Share of trajectories held out for evaluation.")] = _DEFAULTS[
        "eval_fraction"
    ].default,
    seed: Annotated[int, typer.Option(help="Seed of the data order and the head's start.")] = 0,
    device: Annotated[str, typer.Option(help="Where to train: cpu, or a torch device such as cuda:0.")] = "cpu",
    checkpoint_every: Annotated[int, typer.Option(help="Steps between checkpoints.", metavar="N")] = _DEFAULTS[
        "checkpoint_every"
    ].default,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.", metavar="")] = False,
) -> None:
    """Train an EAGLE-3 head on your own calls, for the steps the draft index cannot draft.

    Serve it beside the index with `agentspec serve TARGET --agentspec-drafter OUT
    --agentspec-drafter-method eagle3`. See docs/drafter.md.
    """
    if not target.is_dir():
        _fail(f"TARGET: no such folder: {target}")
    if not (target / "config.json").is_file():
        _fail(f"TARGET: {target} holds no config.json (a Hugging Face model folder)")
    for path in data:
        if not path.is_file():
            _fail(f"--data: no such file: {path}")
    if out.exists() and not out.is_dir():
        _fail(f"--out: {out} is a file")
    try:
        config = DrafterTrainingConfig(
            target=target,
            data=tuple(data),
            out=out,
            tenant=tenant,
            all_tenants=all_tenants,
            draft_vocab=draft_vocab,
            aux_layers=_layers(aux_layers),
            passes=passes,
            steps=steps,
            batch_tokens=batch_tokens,
            max_tokens=max_tokens,
            context_tokens=context_tokens,
            learning_rate=learning_rate,
            hard_below=hard_below,
            easy_weight=easy_weight,
            prompt_weight=prompt_weight,
            eval_fraction=eval_fraction,
            seed=seed,
            device=device,
            checkpoint_every=checkpoint_every,
        )
    except ValidationError as e:
        err = e.errors()[0]
        where = _option(str(err["loc"][0])) + ": " if err["loc"] else ""
        _fail(where + err["msg"].removeprefix("Value error, "))
    if (missing := missing_message("train")) is not None:
        _fail(missing, code=1)

    from transformers.utils import logging as transformers_logging

    from agentspec.replay.trajectories import DataFormatError
    from agentspec.training.progress import run_with_progress
    from agentspec.training.trainer import TrainingError

    # The command's own bars and lines say what happens; not one per file transformers loads.
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    try:
        result = run_with_progress(config, quiet=quiet)
    except (TrainingError, DataFormatError) as e:
        _fail(str(e))
    typer.echo(json.dumps(result.to_json(), indent=2))
