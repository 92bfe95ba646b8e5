"""A training run under rich progress bars (the command line's view of it)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agentspec.training.config import DrafterTrainingConfig
from agentspec.training.trainer import TrainingResult, train_drafter

__all__ = ["run_with_progress"]


def run_with_progress(config: DrafterTrainingConfig, quiet: bool = False) -> TrainingResult:
    """:func:`~agentspec.training.trainer.train_drafter` with a bar of its steps and a line per
    preparation stage, on standard error (standard output gets the result)."""
    console = Console(stderr=True)
    if quiet:
        return train_drafter(config)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not sys.stderr.isatty(),
    ) as bar:
        task = bar.add_task("training", total=config.steps, loss="-")

        def stage(name: str) -> None:
            console.print(f"[dim]{name}[/dim]")

        def step(done: int, total: int, loss: float) -> None:
            bar.update(task, completed=done, loss=f"{loss:.3f}")

        return train_drafter(config, progress=step, stage=stage)
