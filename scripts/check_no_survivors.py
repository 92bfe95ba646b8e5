"""Fail when a process the test command started outlives it.

scripts/test.sh exports ``AGENTSPEC_TEST_RUN`` (an id of that run) before its first stage,
and every process a stage starts inherits it: pytest, the vLLM servers the tests start with
their engine cores and workers, Ray's daemons, its actors and the servers they run. Once
the other stages are done none of them should be left (a leaked engine holds gigabytes)::

    python scripts/check_no_survivors.py [--run-id ID] [--grace SECONDS]

It reads each process's environment from /proc (Linux), leaving out itself and the
processes it runs under (the test command's shell carries the variable too). Processes still
shutting down get ``--grace`` seconds; then it prints the pid, the test that was running
when each survivor started (its ``PYTEST_CURRENT_TEST``) and its command line, and exits 1.
It exits 0 when there are none, and 2 without a run id (``--run-id`` or
``$AGENTSPEC_TEST_RUN``). Not seen: other users' processes, and those started with an
environment of their own (``env -i``, bubblewrap's ``--clearenv``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: The variable scripts/test.sh exports; its value names the run.
RUN_ENV = "AGENTSPEC_TEST_RUN"
PROC = Path("/proc")


@dataclass(frozen=True)
class Survivor:
    pid: int
    test: str | None
    cmdline: str


def _stat(pid: int) -> tuple[str, int] | None:
    """The process's state letter and parent pid, or None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces: the fields follow the last ")".
    state, ppid = text.rpartition(")")[2].split()[:2]
    return state, int(ppid)


def _ancestors() -> set[int]:
    """This process and those it runs under (the test command's shell has the variable too)."""
    pids: set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        stat = _stat(pid)
        pid = stat[1] if stat else 0
    return pids


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's
        return None
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if entry)
    return {name: value for name, _, value in pairs}


def _cmdline(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
        if raw:
            return raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        return f"[{(PROC / str(pid) / 'comm').read_text().strip()}]"
    except OSError:
        return "(gone)"


def survivors(run_id: str) -> list[Survivor]:
    """The live processes, other than this one and its ancestors, of run ``run_id``."""
    skip = _ancestors()
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] == "Z":  # a zombie holds nothing but its pid
            continue
        env = _environ(pid)
        if env is not None and env.get(RUN_ENV) == run_id:
            found.append(Survivor(pid, env.get("PYTEST_CURRENT_TEST"), _cmdline(pid)))
    return sorted(found, key=lambda s: s.pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--run-id", default=os.environ.get(RUN_ENV), help=f"default: ${RUN_ENV}")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds to wait for processes still stopping")
    args = parser.parse_args(argv)
    if not args.run_id:
        print(f"check_no_survivors: no run id: pass --run-id or set {RUN_ENV} (scripts/test.sh does)", file=sys.stderr)
        return 2
    deadline = time.monotonic() + args.grace
    while (left := survivors(args.run_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        print(f"check_no_survivors: no process of test run {args.run_id} is left")
        return 0
    print(
        f"check_no_survivors: {len(left)} process(es) of test run {args.run_id} still alive"
        f" {args.grace:g} s after the tests:",
        file=sys.stderr,
    )
    for s in left:
        print(f"  pid {s.pid} (started during {s.test or 'no test'}): {s.cmdline}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
