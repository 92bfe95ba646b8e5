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
import enum
import functools
import getpass
import json
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
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
class Limits:
    """Per-process resource limits (``setrlimit``) of every command; 0 turns one off."""

    memory_mb: int = 4096
    """Address space of each process (RLIMIT_AS)."""
    cpu_s: int = 120
    """CPU seconds of each process (RLIMIT_CPU); the wall-clock timeout is separate."""
    file_mb: int = 256
    """Largest file a process may write (RLIMIT_FSIZE)."""
    procs: int = 4096
    """Processes and threads of the user, all of theirs counted (RLIMIT_NPROC): a fork-bomb brake."""


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
    isolation: str = "auto"
    """How commands are confined: auto, bwrap or none (see :func:`resolve_isolation`)."""
    limits: Limits = Limits()
    """Resource limits of every command."""


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


# -- running the model's commands ---------------------------------------------------------
#
# The commands come from a model: they are untrusted code. Each one runs with an
# environment built from scratch (nothing of the harness's own, so no API keys), in the
# attempt's throwaway copy of the repository, under a wall-clock timeout that kills
# everything it started, an output cap and resource limits. With bubblewrap it also runs
# in its own namespaces: no network, the system read-only, nothing of the caller's files
# but the working copy. Without it the command runs as the current user: it can read
# their files, reach the network and see their other processes (README.md says more).


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail: a traceback's cause is at the end, the command's context at the start."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail :]}"


SANDBOX_REPO = "/repo"
#: Inside the sandbox (bwrap): its private in-memory temporary folder, and HOME within it.
SANDBOX_TMP = "/tmp"  # a tmpfs mount inside the sandbox, not a folder of the host
SANDBOX_HOME = f"{SANDBOX_TMP}/home"
"""Where the working copy is mounted inside bubblewrap."""
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The few files of /etc that programs and the dynamic linker read; the rest stays hidden.
_ETC_FILES = (
    "/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",
    "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts",
)  # fmt: skip
_READ_CHUNK = 65536
_DRAIN_GRACE_S = 1.0


class Isolation(str, enum.Enum):
    auto = "auto"
    bwrap = "bwrap"
    none = "none"


class IsolationError(RuntimeError):
    """``isolation="bwrap"`` was asked for and bubblewrap does not work here."""


def command_path() -> str:
    """The commands' PATH: the harness's interpreter first (`python` is the one that has
    pytest, even in a virtualenv used without activating it), then the system's folders."""
    return os.pathsep.join([str(Path(sys.executable).parent), _SYSTEM_PATH])


def command_env(home: str, tmpdir: str) -> dict[str, str]:
    """The whole environment of a command: an allow-list, nothing inherited."""
    return {
        "PATH": command_path(),
        "HOME": home,
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _shell() -> str:
    return shutil.which("bash", path=_SYSTEM_PATH) or "/bin/sh"


def _interpreter_dirs() -> list[str]:
    """The folders the harness's interpreter needs (its prefixes), outside the system's."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    candidates += [os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
    dirs: list[str] = []
    for path in candidates + [os.path.realpath(p) for p in candidates]:
        path = os.path.abspath(path)
        if path == "/" or not os.path.isdir(path) or path in dirs:
            continue
        if any(path == d or path.startswith(d.rstrip("/") + "/") for d in _SYSTEM_DIRS):
            continue
        dirs.append(path)
    # A folder inside another one already listed comes with it.
    return [d for d in dirs if not any(d != o and d.startswith(o + "/") for o in dirs)]


def bwrap_argv(bwrap: str, workdir: Path, env: Mapping[str, str]) -> list[str]:
    """bubblewrap's arguments up to the command: the system and the interpreter read-only,
    the working copy read-write at :data:`SANDBOX_REPO`, a private /tmp, no network, new
    user/pid/ipc/uts/cgroup namespaces, and only ``env`` as the environment."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for name in _SYSTEM_DIRS:
        if os.path.islink(name):
            argv += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            argv += ["--ro-bind", name, name]
    for name in _ETC_FILES:
        argv += ["--ro-bind-try", name, name]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", SANDBOX_TMP, "--dir", SANDBOX_HOME]
    for name in _interpreter_dirs():
        argv += ["--ro-bind", name, name]
    argv += ["--bind", str(workdir), SANDBOX_REPO, "--chdir", SANDBOX_REPO]
    argv += ["--remount-ro", "/"]  # the sandbox's own root, holding the mount points
    for key, value in env.items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


@functools.cache
def bwrap_problem() -> str | None:
    """None when bubblewrap works here, else why not; probed once per process by starting
    the harness's interpreter inside it (user namespaces are often unavailable)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bwrap (bubblewrap) is not on PATH"
    with tempfile.TemporaryDirectory(prefix="swe-probe-") as tmp:
        argv = bwrap_argv(bwrap, Path(tmp), command_env(SANDBOX_HOME, SANDBOX_TMP))
        try:
            probe = subprocess.run(
                [*argv, sys.executable, "-c", "pass"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
                env={"PATH": _SYSTEM_PATH},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{bwrap} failed to start: {exc}"
    if probe.returncode != 0:
        error = probe.stderr.decode("utf-8", errors="replace").strip() or f"exit code {probe.returncode}"
        return f"{bwrap} does not work here: {error}"
    return None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (e.g. a container's anonymous uid)
        return f"uid {os.getuid()}"


def unconfined_warning(problem: str) -> str:
    return (
        f"{problem}. The model's commands run UNCONFINED as user {_user()!r}: they can "
        "read and change your files, reach the network and see your processes. Only their "
        "environment is scrubbed, and they run in a throwaway copy under time, output and "
        "resource limits. Install bubblewrap (Debian: apt-get install bubblewrap) or use containers."
    )


def resolve_isolation(mode: str) -> str:
    """``"bwrap"`` or ``"none"``: what ``mode`` (auto, bwrap, none) comes to here.

    ``auto`` falls back to ``none`` with a RuntimeWarning; ``bwrap`` raises IsolationError.
    """
    mode = Isolation(mode).value
    if mode == "none":
        return "none"
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if mode == "bwrap":
        raise IsolationError(problem)
    warnings.warn(unconfined_warning(problem), RuntimeWarning, stacklevel=2)
    return "none"


def _set_limits(limits: Limits) -> None:
    """Runs in the child between fork and exec; bubblewrap and all below inherit the limits."""
    mb = 1024 * 1024
    wanted = [
        (resource.RLIMIT_AS, limits.memory_mb * mb),
        (resource.RLIMIT_CPU, limits.cpu_s),
        (resource.RLIMIT_FSIZE, limits.file_mb * mb),
        (resource.RLIMIT_NPROC, limits.procs),
    ]
    for which, value in wanted:
        if value <= 0:
            continue
        try:
            _, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, value))  # hard too: the command cannot raise it
        except (ValueError, OSError):  # not supported here (e.g. RLIMIT_AS on macOS)
            pass
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass


_UTF8_CONTINUATION = bytes(range(0x80, 0xC0))


class _HeadTail:
    """The first and last ``cap`` bytes of a stream, and how many bytes and (UTF-8)
    characters there were in all."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.chars = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.chars += len(chunk.translate(None, _UTF8_CONTINUATION))
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.cap:
                del self.tail[: len(self.tail) - self.cap]

    def text(self, limit: int) -> str:
        if self.total == len(self.head) + len(self.tail):  # nothing was dropped
            return truncate(bytes(self.head + self.tail).decode("utf-8", errors="replace"), limit)
        head_n = limit // 2
        tail_n = limit - head_n
        head = bytes(self.head).decode("utf-8", errors="replace")[:head_n]
        tail = bytes(self.tail).decode("utf-8", errors="replace")[-tail_n:] if tail_n else ""
        return f"{head}\n[... {self.chars - len(head) - len(tail)} characters cut ...]\n{tail}"


def _has_exited(pid: int) -> bool:
    """Whether ``pid`` has exited, without reaping it: its zombie keeps the pid and the
    process group id from being reused until :meth:`Popen.wait`."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left of the group
        pass


def _read_capped(proc: subprocess.Popen[bytes], timeout_s: float, limit: int) -> tuple[str, bool]:
    """Read ``proc``'s output until it exits or times out, keeping only a head and a tail,
    then kill its process group: on timeout everything, otherwise what it left running."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    out = _HeadTail(cap=4 * limit + 16)  # 4 bytes per character at most in UTF-8
    deadline = time.monotonic() + timeout_s
    timed_out = False
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        eof = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if eof:  # output closed (programs close it just before they exit): wait for the exit
                try:
                    proc.wait(timeout=remaining)
                except subprocess.TimeoutExpired:
                    timed_out = True
                break  # a reaped leader's group id stays reserved while the group has members
            if selector.select(min(remaining, 0.05)):
                chunk = os.read(fd, _READ_CHUNK)
                eof = not chunk
                out.add(chunk)
            if not eof and _has_exited(proc.pid):
                break  # a background child may still hold the pipe open
        _kill_group(proc.pid)
        # What the group wrote before it died; a process that escaped the group (setsid)
        # could keep the pipe open, so this waits a moment at most.
        grace = time.monotonic() + _DRAIN_GRACE_S
        while not eof and (remaining := grace - time.monotonic()) > 0:
            if selector.select(remaining):
                chunk = os.read(fd, _READ_CHUNK)
                eof = not chunk
                out.add(chunk)
    proc.stdout.close()
    proc.wait()
    return out.text(limit), timed_out


def run_command(
    command: str,
    cwd: Path,
    *,
    timeout_s: float,
    limit: int,
    isolation: str = "auto",
    limits: Limits = Limits(),
) -> CommandResult:
    """Run ``command`` in a shell in the working copy ``cwd``.

    The environment is :func:`command_env` only (HOME and TMPDIR in a scratch folder
    deleted afterwards); the output is read in chunks, head and tail kept, so its size
    does not matter; the process group is killed when the shell exits (background
    children die with it) or after ``timeout_s``; ``limits`` apply to every process.
    ``isolation``: see :func:`resolve_isolation`; under bubblewrap ``cwd`` is seen at
    :data:`SANDBOX_REPO` and HOME and TMPDIR are in a private /tmp.
    """
    mode = resolve_isolation(isolation)
    shell = _shell()
    cwd = Path(cwd).resolve()
    with tempfile.TemporaryDirectory(prefix="swe-cmd-", ignore_cleanup_errors=True) as scratch:
        if mode == "bwrap":
            bwrap = shutil.which("bwrap")
            if bwrap is None:
                raise IsolationError("bwrap (bubblewrap) is not on PATH")
            argv = bwrap_argv(bwrap, cwd, command_env(SANDBOX_HOME, SANDBOX_TMP)) + [shell, "-c", command]
            env, run_cwd = {"PATH": _SYSTEM_PATH}, scratch
        else:
            home, tmp = Path(scratch, "home"), Path(scratch, "tmp")
            home.mkdir()
            tmp.mkdir()
            argv = [shell, "-c", command]
            env, run_cwd = command_env(str(home), str(tmp)), str(cwd)
        proc = subprocess.Popen(
            argv,
            cwd=run_cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
            # Only setrlimit calls between fork and exec; the harness starts no threads.
            preexec_fn=functools.partial(_set_limits, limits),  # noqa: PLW1509
        )
        text, timed_out = _read_capped(proc, timeout_s, limit)
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
    return run_command(
        command,
        root,
        timeout_s=settings.command_timeout_s,
        limit=settings.output_limit,
        isolation=settings.isolation,
        limits=settings.limits,
    )


def run_attempt(client: AgentSpecClient, instance: Instance, settings: Settings, attempt: int) -> AttemptResult:
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
_ISOLATION_HELP = (
    "How the model's commands are confined: bwrap (bubblewrap: no network, system read-only, "
    "only the working copy writable), none (scrubbed environment and limits only), auto "
    "(bwrap when it works here, else none with a warning)."
)
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
    isolation: Annotated[Isolation, typer.Option(help=_ISOLATION_HELP)] = Isolation.auto,
    max_memory_mb: Annotated[int, typer.Option(min=0, help="Address space per process, MiB (0: no limit).")] = 4096,
    max_cpu_seconds: Annotated[int, typer.Option(min=0, help="CPU seconds per process (0: no limit).")] = 120,
    max_file_mb: Annotated[int, typer.Option(min=0, help="Largest file a command writes, MiB (0: no limit).")] = 256,
    max_procs: Annotated[int, typer.Option(min=0, help="Processes of your user, all counted (0: no limit).")] = 4096,
) -> None:
    """Run every instance's attempts and print how each went."""
    try:
        mode = resolve_isolation(isolation.value) if isolation != Isolation.auto else None
    except IsolationError as exc:
        console.print(f"[red]--isolation bwrap:[/red] {exc}")
        raise typer.Exit(2) from exc
    if mode is None:  # auto: say it when the commands will run unconfined
        problem = bwrap_problem()
        if problem is not None:
            console.print(f"[bold yellow]warning:[/bold yellow] {unconfined_warning(problem)}")
        mode = "none" if problem else "bwrap"
    limits = Limits(max_memory_mb, max_cpu_seconds, max_file_mb, max_procs)
    settings = Settings(attempts, max_turns, repairs, max_tokens, temperature, timeout, output_limit, mode, limits)
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
    for column in ("instance", "resolved", "calls", "acceptance", "failed calls"):
        table.add_column(column)
    for instance in tasks:
        mine = [r for r in all_results if r.instance_id == instance.instance_id]
        drafted = sum((r.stats or {}).get("draft_tokens", 0) for r in mine)
        accepted = sum((r.stats or {}).get("accepted_tokens", 0) for r in mine)
        rate = f"{accepted / drafted:.2f}" if drafted else "n/a"
        resolved = f"{sum(r.resolved for r in mine)}/{len(mine)}"
        failed = sum(r.error is not None for r in mine)
        table.add_row(
            instance.instance_id,
            resolved,
            str(sum(r.calls for r in mine)),
            rate,
            f"[red]{failed}[/red]" if failed else "0",
        )
    console.print(table)
    failures = [r for r in all_results if r.error is not None]
    if failures:
        # The run did not measure what it was asked to: say so, and fail.
        console.print(
            f"[red]{len(failures)} attempt(s) ended on a call the server refused[/red] (first: {failures[0].error})"
        )
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
