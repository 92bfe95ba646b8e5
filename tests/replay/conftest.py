from __future__ import annotations

import numpy as np
import pytest
import typer

from agentspec.replay.calls import CallSpec, StaticCall, static_call


def agent_call(traj: str, turn: int, prompt: list[int], output: list[int], group: str = "g") -> StaticCall:
    spec = CallSpec(
        call_id=f"{traj}#{turn}",
        session_id=traj,
        group_id=group,
        trajectory_id=traj,
        turn=turn,
        source="toy",
    )
    return static_call(spec, prompt, output)


@pytest.fixture
def make_call():
    return agent_call


@pytest.fixture
def two_turn_agent() -> list[list[StaticCall]]:
    """Turn 2's output repeats turn 1's; turn 2's prompt holds turn 1's prompt + output."""
    out = [10, 11, 12, 13, 14]
    return [
        [
            agent_call("t", 0, [1, 2, 3], out),
            agent_call("t", 1, [1, 2, 3, *out, 4], out),
        ]
    ]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def app() -> typer.Typer:
    """``agentspec bench`` alone, as a typer app (a second command keeps ``bench`` a subcommand)."""
    from agentspec.replay.cli import bench

    app = typer.Typer()
    app.command()(bench)

    @app.command()
    def _unused() -> None:
        pass

    return app
