"""The ``agentspec`` command line: ``agentspec bench``, ``agentspec serve`` and
``agentspec train-drafter``.

The commands are there in the base install (``--help`` included); each imports what it
needs when it runs and, when an extra is missing, says which one to install
(``vllm-agentspec[bench]``; ``vllm-agentspec[serve]`` or ``[cpu]``).
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer
import typer.core

from agentspec.engine.launcher.serve import SERVE_CONTEXT, serve
from agentspec.replay.cli import bench
from agentspec.training.cli import train_drafter

#: typer's value labels, as vLLM's and ``agentspec serve``'s help write them.
_LABELS = {"str": "TEXT", "int": "INT", "int range": "INT", "float": "FLOAT", "float range": "FLOAT"}


def _metavar(param: Any, ctx: Any) -> str | None:
    """An option's value in capitals (``INT``, ``TEXT``, ``FILE``) where it names none
    itself; None to keep typer's label (choices, lists)."""
    label = str(param.display_type(ctx)).strip("<>")
    if label in ("file", "dir", "path"):
        return label.upper()
    return _LABELS.get(label)


class _FlagsWithoutType:
    """Help lists a flag (``--help`` and ``--version`` included) without a type after it:
    it takes no value (typer's rich help would show ``<bool>``); other values are labelled
    in capitals, as ``agentspec serve`` and vLLM label theirs."""

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if param.metavar is not None:
                continue
            if getattr(param, "is_flag", False):
                param.metavar = ""
            else:
                param.metavar = _metavar(param, ctx)
        return params


class _Group(_FlagsWithoutType, typer.core.TyperGroup):
    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run, with click's usage errors (an unknown option, a value out of range) as one
        line and exit 2, like the commands' own errors, not a usage text and a box."""
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:
            # click's exceptions, as typer vendors them (typer.BadParameter's bases).
            if not standalone_mode or not hasattr(e, "format_message"):
                raise
            ctx = getattr(e, "ctx", None)
            where = ctx.command_path if ctx is not None else (prog_name or self.name or "agentspec")
            message = e.format_message()
            if message:  # (no message: the help was shown for a bare command)
                typer.echo(f"error: {where}: {message}", err=True)
            sys.exit(getattr(e, "exit_code", 2))
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


class _Command(_FlagsWithoutType, typer.core.TyperCommand):
    pass


app = typer.Typer(
    name="agentspec",
    cls=_Group,
    help="Session-aware speculative decoding for LLM agent loops on vLLM.",
    no_args_is_help=True,
    add_completion=False,
    # -h as vLLM and most commands take it; serve's own settings say the same.
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        # From the installed distribution's metadata: answers without importing vLLM.
        typer.echo(f"agentspec {importlib.metadata.version('vllm-agentspec')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Session-aware speculative decoding for LLM agent loops on vLLM."""


app.command("bench", cls=_Command, help="Replay recorded agent trajectories through draft proposers.")(bench)
app.command(
    "serve",
    cls=_Command,
    context_settings=SERVE_CONTEXT,
    options_metavar="MODEL [OPTIONS] [vLLM OPTIONS]",
    short_help="Start vLLM's OpenAI server with agentspec.",
)(serve)
app.command(
    "train-drafter",
    cls=_Command,
    short_help="Train an EAGLE-3 head on your calls, for the steps the index cannot draft.",
)(train_drafter)


if __name__ == "__main__":  # pragma: no cover
    app()
