"""The ``agentspec`` command line: ``agentspec bench`` and ``agentspec serve``."""

from __future__ import annotations

import typer

from agentspec.replay.cli import bench

app = typer.Typer(
    name="agentspec",
    help="Session-aware speculative decoding for LLM agent loops on vLLM.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("bench", help="Replay recorded agent trajectories through draft proposers.")(bench)

try:
    from agentspec.engine.serve import SERVE_CONTEXT, serve
except ImportError:  # pragma: no cover - the engine adapter is optional at import time
    pass
else:
    app.command("serve", context_settings=SERVE_CONTEXT, help="Start vLLM's OpenAI server with agentspec.")(serve)


if __name__ == "__main__":  # pragma: no cover
    app()
