"""examples/swe_bench: the harness's pieces offline, then the whole CLI against the tiny
agentspec test server (marked ``server``)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
import tracemalloc
import uuid
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

BWRAP_PROBLEM = harness.bwrap_problem()
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=f"bubblewrap unusable: {BWRAP_PROBLEM}")
ISOLATIONS = ["none", pytest.param("bwrap", marks=needs_bwrap)]
# What a shell adds to the environment it was given.
SHELL_VARS = {"PWD", "OLDPWD", "SHLVL", "_"}


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


# -- how the model's commands are confined ---------------------------------------------------

SECRETS = {
    "OPENAI_API_KEY": "sk-secret-openai",
    "AGENTSPEC_API_KEY": "secret-agentspec",
    "AWS_SECRET_ACCESS_KEY": "secret-aws",
    "GITHUB_TOKEN": "secret-github",
    "HF_TOKEN": "secret-hf",
}


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.txt").write_text("hello from the copy\n")
    return root


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_commands_get_no_inherited_environment(isolation: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    result = harness.run_command("env", _repo(tmp_path), timeout_s=30, limit=10_000, isolation=isolation)
    assert result.returncode == 0, result.output
    env = dict(line.split("=", 1) for line in result.output.splitlines() if "=" in line)
    for name, value in SECRETS.items():
        assert name not in env and value not in result.output
    assert set(env) - SHELL_VARS == set(harness.command_env("h", "t"))
    assert env["PATH"] == harness.command_path()
    assert env["LANG"] == env["LC_ALL"] == "C.UTF-8" and env["PYTHONDONTWRITEBYTECODE"] == "1"


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_home_and_tmpdir_are_throwaway(isolation: str, tmp_path: Path) -> None:
    root = _repo(tmp_path)
    cmd = 'echo "$HOME"; echo "$TMPDIR"; touch "$HOME/h" "$TMPDIR/t"'
    cmd += ' && python -c "import tempfile; print(tempfile.gettempdir())"'
    result = harness.run_command(cmd, root, timeout_s=30, limit=10_000, isolation=isolation)
    assert result.returncode == 0, result.output
    home, tmpdir, python_tmp = result.output.splitlines()
    assert home != os.environ.get("HOME") and tmpdir == python_tmp
    if isolation == "bwrap":
        assert (home, tmpdir) == (harness.SANDBOX_HOME, harness.SANDBOX_TMP)  # the sandbox's private tmp
    else:  # a scratch folder of this command, deleted afterwards
        assert Path(home).parent == Path(tmpdir).parent and Path(home).parent.name.startswith("swe-cmd-")
        assert not Path(home).parent.exists()
    assert sorted(p.name for p in root.iterdir()) == ["a.txt"]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_timeout_kills_background_children_too(isolation: str, tmp_path: Path) -> None:
    root = _repo(tmp_path)
    start = time.monotonic()
    cmd = "(sleep 1; touch marker) & echo started; sleep 30"
    result = harness.run_command(cmd, root, timeout_s=0.5, limit=1000, isolation=isolation)
    assert time.monotonic() - start < 5
    assert result.timed_out and result.returncode is None and "started" in result.output
    time.sleep(2)  # the background child, were it alive, would have written its marker
    assert not (root / "marker").exists()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_nothing_outlives_the_command(isolation: str, tmp_path: Path) -> None:
    root = _repo(tmp_path)
    start = time.monotonic()
    # The background child holds the output pipe open: the call must not wait for it.
    cmd = "(sleep 1; touch marker) & echo quick"
    result = harness.run_command(cmd, root, timeout_s=30, limit=1000, isolation=isolation)
    assert time.monotonic() - start < 0.9
    assert result.returncode == 0 and result.output == "quick\n"
    time.sleep(2)
    assert not (root / "marker").exists()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_huge_output_is_cut_while_read(isolation: str, tmp_path: Path) -> None:
    tracemalloc.start()
    try:
        result = harness.run_command(
            "yes | head -c 50000000", _repo(tmp_path), timeout_s=60, limit=200, isolation=isolation
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.returncode == 0 and not result.timed_out
    assert peak < 5_000_000  # 50 MB went through the pipe
    assert len(result.output) < 260 and "[... 49999800 characters cut ...]" in result.output
    assert result.output.startswith("y\ny\n") and result.output.endswith("y\ny\n")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_resource_limits(isolation: str, tmp_path: Path) -> None:
    root = _repo(tmp_path)

    def run(cmd: str, limits: harness.Limits) -> harness.CommandResult:
        return harness.run_command(cmd, root, timeout_s=30, limit=4000, isolation=isolation, limits=limits)

    grab = "python -c 'b = bytearray(1024 ** 3); print(len(b))'"
    assert run(grab, harness.Limits(memory_mb=4096)).returncode == 0
    small = run(grab, harness.Limits(memory_mb=256))
    assert small.returncode != 0 and "MemoryError" in small.output

    write = "head -c 3000000 /dev/zero > big; ls -l big"
    assert run(write, harness.Limits()).returncode == 0 and (root / "big").stat().st_size == 3_000_000
    run(write, harness.Limits(file_mb=1))
    assert (root / "big").stat().st_size <= 1024 * 1024

    start = time.monotonic()
    spin = run("python -c 'while True: pass'", harness.Limits(cpu_s=1))
    assert not spin.timed_out and spin.returncode != 0 and time.monotonic() - start < 20


@needs_bwrap
def test_bwrap_confines_the_filesystem(tmp_path: Path) -> None:
    root = _repo(tmp_path)
    (tmp_path / "private.txt").write_text("not for the model\n")
    name = f"escaped-{uuid.uuid4().hex[:8]}"
    outside = [EXAMPLE_DIR / name, tmp_path / name, Path(sys.prefix) / name, Path.home() / name]
    cmd = (
        f"pwd; cat a.txt; echo new > new.txt; cat '{tmp_path / 'private.txt'}'\n"
        + "".join(f"touch '{p}' 2>/dev/null && echo wrote '{p}'\n" for p in outside)
        + "touch /escaped 2>/dev/null && echo wrote /escaped\n"
        + "echo MOUNTS; cat /proc/self/mountinfo"
    )
    try:
        result = harness.run_command(cmd, root, timeout_s=30, limit=100_000, isolation="bwrap")
        escaped = [p for p in outside if p.exists()]
    finally:
        for p in outside:
            p.unlink(missing_ok=True)
    assert escaped == [] and "wrote" not in result.output
    output, mounts = result.output.split("MOUNTS\n")
    assert output.startswith(f"{harness.SANDBOX_REPO}\nhello from the copy\n") and "not for the model" not in output
    assert (root / "new.txt").read_text() == "new\n"
    # The only writable mount of a real filesystem is the working copy; the others are the
    # sandbox's own (its /tmp, /proc, /dev).
    writable = []
    for line in mounts.splitlines():
        fields, fstype = line.split(" - ")[0].split(), line.split(" - ")[1].split()[0]
        if "rw" in fields[5].split(",") and fstype not in {"tmpfs", "proc", "devpts", "devtmpfs", "mqueue"}:
            writable.append(fields[4])
    assert writable == [harness.SANDBOX_REPO], mounts


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_network(isolation: str, tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')"
        cmd = f'python -c "{connect}"'
        result = harness.run_command(cmd, _repo(tmp_path), timeout_s=30, limit=4000, isolation=isolation)
        server.settimeout(0.2)
        try:
            server.accept()[0].close()
            accepted = True
        except TimeoutError:
            accepted = False
    if isolation == "none":  # nothing stops it: the control that the check can see a connection
        assert accepted and "connected" in result.output
    else:
        assert not accepted and result.returncode != 0 and "connected" not in result.output


def test_auto_isolation_falls_back_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "bwrap_problem", lambda: "bwrap (bubblewrap) is not on PATH")
    with pytest.warns(RuntimeWarning, match="UNCONFINED"):
        assert harness.resolve_isolation("auto") == "none"
    with pytest.raises(harness.IsolationError, match="not on PATH"):
        harness.resolve_isolation("bwrap")
    assert harness.resolve_isolation("none") == "none"
    with pytest.warns(RuntimeWarning, match="UNCONFINED"):
        assert harness.run_command("echo ok", _repo(tmp_path), timeout_s=10, limit=100).output == "ok\n"

    runner = CliRunner()
    refused = runner.invoke(harness.app, ["--isolation", "bwrap", "--base-url", "http://127.0.0.1:9"])
    assert refused.exit_code == 2 and "not on PATH" in refused.output
    warned = runner.invoke(harness.app, ["--base-url", "http://127.0.0.1:9"])  # no server there
    assert warned.exit_code == 1 and "UNCONFINED" in warned.output and "server error" in warned.output


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


def test_each_attempt_gets_a_fresh_copy_that_is_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Path, harness.CommandResult]] = []
    real = harness.run_command

    def spy(command: str, cwd: Path, **kwargs: Any) -> harness.CommandResult:
        calls.append((cwd, real(command, cwd, **kwargs)))
        return calls[-1][1]

    monkeypatch.setattr(harness, "run_command", spy)
    replies = ["```bash\necho junk > junk.txt; ls\n```", "```bash\nls\n```"]
    settings = harness.Settings(attempts=2, max_turns=1, repairs=0)
    instance = dataclasses.replace(ADD, test_command="true")
    first, second = harness.run_instance(_ScriptedClient(replies), instance, settings)  # type: ignore[arg-type]
    (copy1, ls1), _, (copy2, ls2), _ = calls  # each attempt: its command, then the tests
    assert copy1 != copy2
    assert "junk.txt" in ls1.output and "junk.txt" not in ls2.output and "utils.py" in ls2.output
    assert "+++ b/junk.txt" in first.patch and second.patch == ""
    assert not copy1.exists() and not copy2.exists()


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


@pytest.mark.server
def test_a_refused_call_fails_the_run_and_is_flagged(agentspec_server: Any, tmp_path: Path) -> None:
    # A problem statement longer than the tiny model's context (2048 tokens): vLLM refuses
    # the first call. The run reports it, marks it in its table and exits non-zero.
    too_long = dataclasses.replace(ADD, problem_statement="The sum is wrong. " * 1500)
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(dataclasses.asdict(too_long)) + "\n")
    args = [
        "--base-url", agentspec_server.url, "--model", agentspec_server.model, "--instances", str(path),
        "--attempts", "1", "--max-turns", "1", "--repairs", "0", "--max-tokens", "8",
    ]  # fmt: skip
    outcome = CliRunner().invoke(harness.app, args, env={"COLUMNS": "200"})
    assert outcome.exit_code == 1, outcome.output
    assert "1 attempt(s) ended on a call the server refused" in outcome.output
    assert "context" in outcome.output.lower()
    row = next(line for line in outcome.output.splitlines() if ADD.instance_id in line and "│" in line)
    assert row.rstrip(" │").endswith("1")  # the "failed calls" column
