"""click's usage errors (an unknown option or command, a value out of range or of the wrong
type, a missing argument) read as the commands' own errors: one line naming the command and
the option, exit 2, no usage text or box."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from agentspec.cli import app


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["bench", "--limit", "0"], "error: agentspec bench: Invalid value for '--limit': "),
        (["bench", "--replicas", "two"], "error: agentspec bench: Invalid value for '--replicas': "),
        (["bench", "--nope"], "error: agentspec bench: No such option: --nope"),
        (["bench", "--drafter-tokens", "17"], "error: agentspec bench: Invalid value for '--drafter-tokens': "),
        (["nope"], "error: agentspec: No such command 'nope'."),
        (["train-drafter"], "error: agentspec train-drafter: Missing argument 'TARGET'."),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args: list[str], line: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [text for text in result.output.splitlines() if text.strip()]
    assert len(lines) == 1 and lines[0].startswith(line), result.output


def test_no_command_shows_the_help() -> None:
    result = CliRunner().invoke(app, [])
    assert "Usage: agentspec" in result.output and "error:" not in result.output
