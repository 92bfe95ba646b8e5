"""A small SWE-bench-style harness on agentspec's session-aware client.

    agentspec serve Qwen/Qwen2.5-Coder-7B-Instruct --port 8000
    python examples/swe_bench/harness.py --base-url http://localhost:8000 --attempts 4

For every task instance it runs ``--attempts`` sampled attempts of a bash-only agent
(mini-swe-agent style). Each attempt is one agent session; the attempts of one instance
form one group, so the backend they are pinned to drafts each attempt from its siblings.
When an attempt's tests fail, the attempt is seeded for repair and the agent goes on in
the same session. See README.md next to this file.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from agentspec.client import AgentSpecClient, AgentSpecClientError, ServerRefusedError, Session

DEFAULT_INSTANCES = Path(__file__).with_name("instances.jsonl")
DEFAULT_URL = "http://localhost:8000"

SYSTEM_PROMPT = """\
You are a software engineer fixing a bug in a small Python repository. You work in a \
shell whose current folder is the repository's root.

Every reply has a short thought followed by exactly one ```bash code block with the \
command(s) to run next. The next message shows the exit code and output of that block. \
Each block runs in a fresh shell, so `cd` and variables do not carry over. Edit files \
with sed, or rewrite them whole with cat and a heredoc. Never start an interactive program.

When the bug is fixed and the tests pass, reply with a block holding only:
```bash
echo SUBMIT
```"""

# Folders the agent's tools create that are no part of its change.
_IGNORED_DIRS = {".git", "__pycache__", ".pytest_cache"}
_BASH_BLOCK = re.compile(r"```(?:bash|sh)[ \t]*\n(.*?)```", re.DOTALL)
_SUBMIT_LINES = {"SUBMIT", "echo SUBMIT"}


@dataclasses.dataclass(frozen=True)
class Instance:
    """One task: a bug report, the repository as path -> contents, and how to test it."""

    instance_id: str
    problem_statement: str
    repo: dict[str, str]
    test_command: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Instance:
        return cls(
            instance_id=str(data["instance_id"]),
            problem_statement=str(data["problem_statement"]),
            repo={str(k): str(v) for k, v in data["repo"].items()},
            test_command=str(data["test_command"]),
        )


def load_instances(path: str | os.PathLike[str]) -> list[Instance]:
    """Read a JSONL file of instances (blank lines skipped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [Instance.from_json(json.loads(line)) for line in lines if line.strip()]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How each attempt runs."""

    attempts: int = 2
    max_turns: int = 10
    repairs: int = 1
    max_tokens: int = 1024
    temperature: float = 0.7
    command_timeout_s: float = 60.0
    output_limit: int = 4000
    """Characters of a command's output sent back to the model (head and tail kept)."""


@dataclasses.dataclass(frozen=True)
class CommandResult:
    returncode: int | None
    """None when the command was killed for running past its timeout."""
    output: str
    """stdout and stderr interleaved, truncated to the limit."""
    timed_out: bool = False

    def observation(self) -> str:
        status = "timed out (killed)" if self.timed_out else f"exit code {self.returncode}"
        return f"{status}\n{self.output}" if self.output else status


@dataclasses.dataclass
class AttemptResult:
    """What one attempt did; ``stats`` is the server's session statistics, None on plain vLLM."""

    instance_id: str
    attempt: int
    session_id: str
    group_id: str
    backend: str | None = None
    calls: int = 0
    submitted: bool = False
    repairs: int = 0
    resolved: bool = False
    test_output: str = ""
    patch: str = ""
    error: str | None = None
    stats: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- the model's replies -----------------------------------------------------------------


def extract_bash(text: str) -> list[str]:
    """The ```bash (or ```sh) blocks of a reply, in order."""
    return [block.strip() for block in _BASH_BLOCK.findall(text)]


def wants_submit(text: str) -> bool:
    """True when a line of the reply (inside a block or not) is ``SUBMIT`` or ``echo SUBMIT``."""
    return any(line.strip() in _SUBMIT_LINES for line in text.splitlines())


# -- the sandbox -------------------------------------------------------------------------


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail: a traceback's cause is at the end, the command's context at the start."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail:]}"


def run_command(command: str, cwd: Path, *, timeout_s: float, limit: int) -> CommandResult:
    """Run ``command`` in a shell in ``cwd``; kill its whole process group on timeout."""
    env = dict(os.environ)
    # `python` in a task's commands means the interpreter running the harness (which has
    # pytest), even when its folder is not on PATH (a virtualenv used without activating).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    shell = shutil.which("bash") or "sh"
    proc = subprocess.Popen(
        [shell, "-c", command],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group, so a timeout also kills what it started
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    text = truncate(out.decode("utf-8", errors="replace"), limit)
    return CommandResult(None if timed_out else proc.returncode, text, timed_out)


def write_repo(files: Mapping[str, str], root: Path) -> Path:
    """Write an instance's files under ``root`` (created)."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    return root


def read_repo(root: Path) -> dict[str, str]:
    """The text files under ``root``, without tool caches."""
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or _IGNORED_DIRS.intersection(rel.parts):
            continue
        try:
            files[rel.as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return files


def changed_files(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


def unified_diff(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """A git-style patch from ``before`` to ``after`` (the attempt's prediction)."""
    parts: list[str] = []
    for rel in changed_files(before, after):
        old, new = before.get(rel), after.get(rel)
        parts.extend(
            difflib.unified_diff(
                (old or "").splitlines(keepends=True),
                (new or "").splitlines(keepends=True),
                fromfile=f"a/{rel}" if old is not None else "/dev/null",
                tofile=f"b/{rel}" if new is not None else "/dev/null",
            )
        )
    return "".join(parts)


def repair_seed(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """The text a repair turn will most likely rewrite: the changed files as they are now.

    The attempt's own turns are already in the session's draft index (the server indexes
    every prompt), but the files are there only as far as the agent printed them, and a
    fix usually rewrites them. When nothing changed, the fix will rewrite the original
    sources, so all files are seeded.
    """
    paths = [p for p in changed_files(before, after) if p in after] or sorted(after)
    return "\n".join(f"# {p}\n{after[p]}" for p in paths if after.get(p))


# -- the agent ---------------------------------------------------------------------------


def task_message(instance: Instance) -> str:
    files = ", ".join(sorted(instance.repo))
    return (
        f"Fix this issue.\n\n{instance.problem_statement.strip()}\n\n"
        f"Files: {files}\nThe tests run with: {instance.test_command}"
    )


def add_user(messages: list[dict[str, str]], text: str) -> None:
    # Chat templates expect user and assistant to alternate: merge into a trailing user turn.
    if messages and messages[-1]["role"] == "user":
        messages[-1] = {"role": "user", "content": messages[-1]["content"] + "\n\n" + text}
    else:
        messages.append({"role": "user", "content": text})


def agent_loop(session: Session, messages: list[dict[str, str]], root: Path, settings: Settings) -> bool:
    """Up to ``max_turns`` model turns in ``root``; True when the model submitted."""
    for _ in range(settings.max_turns):
        reply = session.chat(messages, max_tokens=settings.max_tokens, temperature=settings.temperature)
        text = reply.content or ""
        messages.append({"role": "assistant", "content": text})
        blocks = extract_bash(text)
        commands = [b for b in blocks if b not in _SUBMIT_LINES]
        if len(blocks) > 1:
            add_user(messages, f"Your reply had {len(blocks)} ```bash blocks; send exactly one.")
        elif commands:
            add_user(messages, run_in(root, commands[0], settings).observation())
        if wants_submit(text):
            return True
        if not blocks:
            add_user(messages, "Your reply had no ```bash block; send exactly one.")
    return False


def run_in(root: Path, command: str, settings: Settings) -> CommandResult:
    return run_command(command, root, timeout_s=settings.command_timeout_s, limit=settings.output_limit)


def run_attempt(
    client: AgentSpecClient, instance: Instance, settings: Settings, attempt: int
) -> AttemptResult:
    """One attempt: a session in the instance's group, in a fresh copy of its repository."""
    # A fresh suffix keeps a rerun's sessions apart on a server that still holds the last run's.
    session_id = f"{instance.instance_id}.{attempt}.{uuid.uuid4().hex[:8]}"
    with (
        client.session(session_id=session_id, group_id=instance.instance_id) as session,
        tempfile.TemporaryDirectory(prefix="swe-attempt-") as tmp,
    ):
        result = AttemptResult(instance.instance_id, attempt, session.session_id, session.group_id)
        root = write_repo(instance.repo, Path(tmp) / "repo")
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task_message(instance)},
        ]
        for round_ in range(settings.repairs + 1):
            try:
                result.submitted = agent_loop(session, messages, root, settings)
            except ServerRefusedError as exc:  # e.g. the conversation outgrew the context
                result.error = exc.message
            test = run_in(root, instance.test_command, settings)
            result.resolved = test.returncode == 0
            result.test_output = test.output
            if result.resolved or result.error or round_ == settings.repairs:
                break
            # Seeds only steer drafting; the model sees the failure through the message below.
            seed = repair_seed(instance.repo, read_repo(root))
            if seed:  # empty when the agent emptied every file; an empty seed is refused
                session.repair(failed_attempt=seed, feedback=test.output or None)
            add_user(
                messages,
                f"The tests still fail ({test.observation().splitlines()[0]}):\n{test.output}\n\n"
                "Fix the code, run the tests, then submit.",
            )
            result.repairs += 1
        result.patch = unified_diff(instance.repo, read_repo(root))
        result.calls = len(session.turns)
        result.backend = session.backend
        try:
            result.stats = session.stats().model_dump()
        except (AgentSpecClientError, httpx.HTTPError):  # plain vLLM has no session statistics
            result.stats = None
    return result


def run_instance(
    client: AgentSpecClient,
    instance: Instance,
    settings: Settings,
    report: Callable[[AttemptResult], None] | None = None,
) -> list[AttemptResult]:
    """All attempts of one instance, one after another, so each drafts from the earlier ones."""
    results = []
    for attempt in range(1, settings.attempts + 1):
        result = run_attempt(client, instance, settings, attempt)
        if report is not None:
            report(result)
        results.append(result)
    return results


# -- the command line --------------------------------------------------------------------

_URL_HELP = f"Server URL; repeat for several backends (default: {DEFAULT_URL})."
_INSTANCES_HELP = "JSONL file of task instances (default: instances.jsonl beside harness.py)."
app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0] if __doc__ else None)
console = Console()


def _first_model(base_url: str) -> str:
    response = httpx.get(base_url.rstrip("/").removesuffix("/v1") + "/v1/models", timeout=10)
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])


def _fmt_rate(stats: Mapping[str, Any] | None) -> str:
    if stats is None or stats.get("acceptance_rate") is None:
        return "n/a"
    return f"{stats['acceptance_rate']:.2f}"


def _print_attempt(result: AttemptResult, total: int) -> None:
    stats = result.stats
    spec = (
        f"acceptance {_fmt_rate(stats)}, drafted {stats['draft_tokens']}, accepted {stats['accepted_tokens']}"
        if stats is not None
        else "acceptance n/a (no agentspec session stats)"
    )
    verdict = "[green]yes[/green]" if result.resolved else "[red]no[/red]"
    console.print(
        f"[bold]{result.instance_id}[/bold] attempt {result.attempt}/{total}: {result.calls} calls, "
        f"resolved {verdict}, repairs {result.repairs}, {spec}"
        + (f" [yellow]({result.error})[/yellow]" if result.error else "")
    )


@app.command()
def main(
    base_url: Annotated[list[str] | None, typer.Option("--base-url", help=_URL_HELP)] = None,
    model: Annotated[str | None, typer.Option(help="Model name; default: the first server's.")] = None,
    instances: Annotated[Path, typer.Option(help=_INSTANCES_HELP, show_default=False)] = DEFAULT_INSTANCES,
    attempts: Annotated[int, typer.Option(min=1, help="Sampled attempts per instance (one group).")] = 2,
    max_turns: Annotated[int, typer.Option(min=1, help="Model turns before the tests run.")] = 10,
    repairs: Annotated[int, typer.Option(min=0, help="Repair rounds after failing tests.")] = 1,
    max_tokens: Annotated[int, typer.Option(min=1)] = 1024,
    temperature: Annotated[float, typer.Option(min=0.0)] = 0.7,
    timeout: Annotated[float, typer.Option(help="Seconds a command may run.")] = 60.0,
    output_limit: Annotated[int, typer.Option(min=100, help="Output characters sent back.")] = 4000,
    results: Annotated[Path | None, typer.Option(help="Write one JSON line per attempt here.")] = None,
) -> None:
    """Run every instance's attempts and print how each went."""
    settings = Settings(attempts, max_turns, repairs, max_tokens, temperature, timeout, output_limit)
    tasks = load_instances(instances)
    backends = base_url or [DEFAULT_URL]
    all_results: list[AttemptResult] = []
    try:
        model = model or _first_model(backends[0])
        with AgentSpecClient(backends=backends, model=model) as client:
            for instance in tasks:
                report = lambda r: _print_attempt(r, attempts)  # noqa: E731
                all_results += run_instance(client, instance, settings, report)
    except (AgentSpecClientError, httpx.HTTPError) as exc:
        console.print(f"[red]server error:[/red] {exc}")
        raise typer.Exit(1) from exc
    if results is not None:
        results.write_text("".join(json.dumps(r.to_json()) + "\n" for r in all_results), encoding="utf-8")

    table = Table(title=f"{model}: {len(tasks)} instances x {attempts} attempts")
    for column in ("instance", "resolved", "calls", "acceptance"):
        table.add_column(column)
    for instance in tasks:
        mine = [r for r in all_results if r.instance_id == instance.instance_id]
        drafted = sum((r.stats or {}).get("draft_tokens", 0) for r in mine)
        accepted = sum((r.stats or {}).get("accepted_tokens", 0) for r in mine)
        rate = f"{accepted / drafted:.2f}" if drafted else "n/a"
        resolved = f"{sum(r.resolved for r in mine)}/{len(mine)}"
        table.add_row(instance.instance_id, resolved, str(sum(r.calls for r in mine)), rate)
    console.print(table)


if __name__ == "__main__":
    app()
