"""examples/swe_bench/openhands_harness.py, the whole command line, against a real
``agentspec serve`` on the tiny model: two attempts of one instance in one group, the first
attempt's patch seeded into the group before the second, failed calls flagged."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from codeact_harness import SYSTEM_PROMPT, tool_call_regex
from typer.testing import CliRunner

EXAMPLE_DIR = Path(__file__).resolve().parents[4] / "examples" / "swe_bench"
sys.path.insert(0, str(EXAMPLE_DIR))

import openhands_harness

pytestmark = pytest.mark.server


def test_two_attempts_share_the_instance_group_and_the_failed_patch(agentspec_server: Any, tmp_path: Path) -> None:
    # Every step appends to a file (so an attempt leaves a patch) and never fixes the bug.
    body = {"structured_outputs": {"regex": tool_call_regex(r"echo [a-z]{1,8} >> notes\.txt")}}
    out = tmp_path / "results.jsonl"
    prompt = tmp_path / "system.txt"
    prompt.write_text(SYSTEM_PROMPT)  # OpenHands' own is longer than the tiny model's context
    result = CliRunner().invoke(
        openhands_harness.app,
        [
            "--base-url", agentspec_server.url, "--model", "tiny", "--attempts", "2", "--max-steps", "3",
            "--max-tokens", "96", "--temperature", "0", "--extra-body", json.dumps(body),
            "--isolation", "none", "--results", str(out), "--system-prompt", str(prompt),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    first = [r for r in rows if r["instance_id"] == "demo__mathutils-add"]
    assert [r["attempt"] for r in first] == [1, 2] and not any(r["resolved"] or r["error"] for r in first)
    assert "notes.txt" in first[0]["patch"] and all(r["steps"] == 3 for r in first)
    for row in first:
        assert row["stats"]["group_id"] == "demo__mathutils-add" and row["stats"]["calls"] == 3
    # The first attempt's patch went into the group before the second attempt ran.
    assert first[0]["seeded_patch_tokens"] == 0 and first[1]["seeded_patch_tokens"] > 0


def test_a_failed_call_is_flagged_and_exits_non_zero(agentspec_server: Any, tmp_path: Path) -> None:
    # 3000 tokens of output cannot fit the tiny model's 2048-token context: vLLM refuses
    # every call, and the conversation stops.
    result = CliRunner().invoke(
        openhands_harness.app,
        ["--base-url", agentspec_server.url, "--model", "tiny", "--attempts", "1", "--max-steps", "2",
         "--max-tokens", "3000", "--isolation", "none"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "call failed: demo__mathutils-add attempt 1" in result.output
