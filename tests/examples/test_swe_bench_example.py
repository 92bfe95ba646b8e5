"""examples/swe_bench: the harness's pieces offline, then the whole CLI against the tiny
agentspec test server (marked ``server``)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "swe_bench"
sys.path.insert(0, str(EXAMPLE_DIR))

import harness  # noqa: E402

INSTANCES = harness.load_instances(harness.DEFAULT_INSTANCES)
ADD = next(i for i in INSTANCES if i.instance_id == "demo__mathutils-add")


# -- offline -------------------------------------------------------------------------------


def test_bundled_instances_fail_before_the_fix(tmp_path: Path) -> None:
    assert len(INSTANCES) == 2 and len({i.instance_id for i in INSTANCES}) == 2
    for inst in INSTANCES:
        root = harness.write_repo(inst.repo, tmp_path / inst.instance_id)
        result = harness.run_command(inst.test_command, root, timeout_s=60, limit=4000)
        assert result.returncode not in (0, None), result.output
        assert "failed" in result.output


def test_extract_bash() -> None:
    assert harness.extract_bash("Look first.\n```bash\nls -la\ncat a.py\n```\n") == ["ls -la\ncat a.py"]
    assert harness.extract_bash("```sh\necho hi\n```") == ["echo hi"]
    assert harness.extract_bash("```python\nprint(1)\n```\nno shell here") == []
    assert harness.extract_bash("```bash\nls\n```\nthen\n```bash\npwd\n```") == ["ls", "pwd"]


def test_wants_submit() -> None:
    assert harness.wants_submit("Done.\n```bash\necho SUBMIT\n```")
    assert harness.wants_submit("All tests pass.\nSUBMIT")
    assert not harness.wants_submit("I will SUBMIT once the tests pass.\n```bash\nls\n```")


def test_run_command_captures_output_and_exit_code(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    result = harness.run_command("cat a.txt; echo oops >&2; exit 3", tmp_path, timeout_s=10, limit=1000)
    assert result.returncode == 3 and not result.timed_out
    assert "hello" in result.output and "oops" in result.output
    assert result.observation().startswith("exit code 3\n")


def test_run_command_enforces_the_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    # The background child keeps the pipe open: only killing the whole group ends the call.
    result = harness.run_command("sleep 30 & echo started; sleep 30", tmp_path, timeout_s=0.5, limit=1000)
    assert time.monotonic() - start < 10
    assert result.timed_out and result.returncode is None
    assert "started" in result.output and "timed out" in result.observation()


def test_run_command_truncates_long_output(tmp_path: Path) -> None:
    cmd = "python -c \"print('A' * 5000 + 'B' * 5000)\""
    result = harness.run_command(cmd, tmp_path, timeout_s=30, limit=200)
    assert result.returncode == 0
    assert len(result.output) < 260 and "characters cut" in result.output
    assert result.output.startswith("A" * 100) and result.output.rstrip().endswith("B" * 99)


class _ScriptedSession:
    """Just enough of a client Session to drive the agent loop with canned replies."""

    def __init__(self, replies: list[str], session_id: str, group_id: str) -> None:
        self.replies = replies
        self.session_id, self.group_id = session_id, group_id
        self.turns: list[Any] = []
        self.repairs: list[tuple[str, str | None]] = []
        self.backend = "scripted"

    def chat(self, messages: list[dict[str, str]], **params: Any) -> Any:
        self.turns.append(list(messages))
        return type("Reply", (), {"content": self.replies.pop(0)})()

    def repair(self, failed_attempt: str, feedback: str | None = None) -> None:
        self.repairs.append((failed_attempt, feedback))

    def stats(self) -> Any:
        raise harness.AgentSpecClientError("no stats here")

    def __enter__(self) -> _ScriptedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _ScriptedClient:
    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.sessions: list[_ScriptedSession] = []

    def session(self, session_id: str, group_id: str) -> _ScriptedSession:
        self.sessions.append(_ScriptedSession(self.replies, session_id, group_id))
        return self.sessions[-1]


FIX = "```bash\nsed 's/a - b/a + b/' utils.py > fixed.py && mv fixed.py utils.py\n```"


def test_scripted_attempt_is_repaired_and_resolved() -> None:
    replies = ["Let me look.\n```bash\ncat utils.py\n```", "Done.\nSUBMIT", FIX, "```bash\necho SUBMIT\n```"]
    client = _ScriptedClient(replies)
    settings = harness.Settings(attempts=1, max_turns=3, repairs=1, output_limit=2000)
    (result,) = harness.run_instance(client, ADD, settings)  # type: ignore[arg-type]
    session = client.sessions[0]
    assert result.resolved and result.submitted and result.repairs == 1 and result.calls == 4
    assert result.group_id == ADD.instance_id and result.stats is None
    assert "+    return a + b" in result.patch
    # The first turn's output came back as the next user message.
    assert "return a - b" in session.turns[1][-1]["content"]
    # Nothing had changed when the tests failed: the original sources were seeded.
    ((seeded, feedback),) = session.repairs
    assert "return a - b" in seeded and feedback and "failed" in feedback
    assert "The tests still fail" in session.turns[2][-1]["content"]


# -- against the tiny agentspec server -----------------------------------------------------


@pytest.fixture
def one_instance(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(dataclasses.asdict(ADD)) + "\n")
    yield path


@pytest.mark.server
def test_harness_end_to_end(agentspec_server: Any, one_instance: Path, tmp_path: Path) -> None:
    results_path = tmp_path / "results.jsonl"
    args = [
        "--base-url", agentspec_server.url, "--model", agentspec_server.model,
        "--instances", str(one_instance), "--attempts", "2", "--max-turns", "2", "--repairs", "1",
        "--max-tokens", "16", "--output-limit", "300", "--results", str(results_path),
    ]  # fmt: skip
    outcome = CliRunner().invoke(harness.app, args)
    assert outcome.exit_code == 0, outcome.output
    assert "attempt 1/2" in outcome.output and "attempt 2/2" in outcome.output

    results = [json.loads(line) for line in results_path.read_text().splitlines()]
    assert [r["attempt"] for r in results] == [1, 2]
    assert len({r["session_id"] for r in results}) == 2
    for r in results:
        assert r["error"] is None and r["group_id"] == ADD.instance_id
        # Gibberish never submits: 2 turns, failing tests, one repair round of 2 turns more.
        assert r["calls"] == 4 and r["repairs"] == 1 and not r["submitted"]
        assert r["resolved"] is False and "failed" in r["test_output"]
        # The server's own view of the session: its calls, its group, the repair seed.
        stats = httpx.get(f"{agentspec_server.url}/agentspec/v1/sessions/{r['session_id']}", timeout=10)
        stats.raise_for_status()
        server = stats.json()
        assert server["calls"] == 4 and server["group_id"] == ADD.instance_id
        assert server["seeded_tokens"] > 0
        assert r["stats"]["calls"] == 4 and r["stats"]["seeded_tokens"] == server["seeded_tokens"]
