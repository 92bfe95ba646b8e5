"""The ``agentspec`` command line: ``agentspec bench`` and ``agentspec serve``.

Both commands are there in the base install (``--help`` included); each imports what it
needs when it runs and, when an extra is missing, says which one to install
(``vllm-agentspec[bench]``; ``vllm-agentspec[serve]`` or ``[cpu]``).
"""

from __future__ import annotations

import importlib.metadata
from typing import Annotated

import typer

from agentspec.engine.launcher.serve import SERVE_CONTEXT, serve
from agentspec.replay.cli import bench

app = typer.Typer(
    name="agentspec",
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


app.command("bench", help="Replay recorded agent trajectories through draft proposers.")(bench)
app.command(
    "serve",
    context_settings=SERVE_CONTEXT,
    options_metavar="MODEL [OPTIONS] [vLLM OPTIONS]",
    short_help="Start vLLM's OpenAI server with agentspec.",
)(serve)


if __name__ == "__main__":  # pragma: no cover
    app()
