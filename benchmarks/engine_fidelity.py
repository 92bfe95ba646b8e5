"""How far the replay benchmark stands from a real server as concurrency grows.

    python benchmarks/engine_fidelity.py [--model DIR] [--concurrency 1,4,8,16,32] [--turns 3]

One ``agentspec serve`` (the tiny test model unless ``--model``) logs every drafting step
(``--agentspec-step-log-dir``). At each concurrency C, C agent sessions run side by side
(agentspec.testing.fidelity: multi-turn loops as token ids, siblings of a group sharing
their first prompt), each in a tenant of its own, so every run starts from an empty index.
For each run it prints the draft and accepted tokens three ways:

- server: the server's own per-session statistics, summed;
- steps: ``agentspec.replay.step_replay`` redoing the server's logged steps (batch order,
  the caps the batch budget set) from the calls' token ids; "differ" counts the steps
  where it parted from the log (0 means step-exact);
- bench: the replay benchmark's loop (``agentspec.replay.simulate.replay_call``), one call
  at a time in arrival order with no batch budget, as ``agentspec bench`` replays;
- lockstep: ``agentspec bench --lockstep --concurrency C``: the sessions' calls in flight
  decode a step each in turn, as one server batch does, their drafts capped by the
  server's default batch budget for the calls in flight.

bench/server is the benchmark's error at that concurrency when calls run one at a time:
the budget's cuts (above ``--agentspec-full-draft-batch``, 8) and the order in which
concurrent calls see each other's text; lockstep/server what is left in lockstep (the
server's batches also hold requests still prefilling, and its batch order is its own).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from pathlib import Path

import httpx
import numpy as np

from agentspec import wire
from agentspec.engine.settings import EngineSettings
from agentspec.index import DraftIndex
from agentspec.index.policy import IndexConfig
from agentspec.replay import ReplayConfig, replay_workloads
from agentspec.replay.calls import CallSpec, static_call
from agentspec.replay.driver_proposer import DriverProposer
from agentspec.replay.simulate import Tally, replay_call
from agentspec.replay.step_replay import replay_steps
from agentspec.testing.fidelity import (
    AgentCall,
    AgentWorkload,
    as_logged,
    logged_calls,
    run_agents,
)
from agentspec.testing.server import VLLMServer
from agentspec.testing.tiny_model import ENV_DIR, build_tiny_model


def _server_totals(base: str, sessions: set[str], salt: str) -> tuple[int, int]:
    drafted = accepted = 0
    for session in sessions:
        r = httpx.get(base + wire.SESSION_STATS_PATH + session, params={wire.CACHE_SALT_FIELD: salt}, timeout=30)
        r.raise_for_status()
        drafted += r.json()["draft_tokens"]
        accepted += r.json()["accepted_tokens"]
    return drafted, accepted


def _bench_totals(calls: dict[str, AgentCall], order: list[str], config: IndexConfig) -> tuple[int, int]:
    """The benchmark's loop over the calls in the order they reached the server."""
    proposer = DriverProposer(DraftIndex(config))
    tally = Tally()
    for n, req in enumerate(order):
        call = calls[req]
        spec = CallSpec(f"c{n}", call.session, call.group, call.session, call.turn, "fidelity")
        output = np.asarray(call.output, dtype=np.int32)
        replay_call(proposer, spec, np.asarray(call.prompt, dtype=np.int32), output, call.output, tally)
    return tally.drafted_tokens, tally.accepted_tokens


def _lockstep_totals(calls: list[AgentCall], concurrency: int, config: IndexConfig) -> tuple[int, int]:
    """``agentspec bench --lockstep``'s loop over the sessions, ``concurrency`` in flight."""
    sessions: dict[str, list[AgentCall]] = {}
    for call in sorted(calls, key=lambda c: c.turn):
        sessions.setdefault(call.session, []).append(call)

    def spec(c: AgentCall) -> CallSpec:
        return CallSpec(f"{c.session}#{c.turn}", c.session, c.group, c.session, c.turn, "fidelity")

    workload = [
        [static_call(spec(c), c.prompt, c.output) for c in session_calls] for session_calls in sessions.values()
    ]
    replay = ReplayConfig(proposers=("agentspec",), concurrency=concurrency, lockstep=True)
    (result,) = replay_workloads(replay, {"fidelity": workload})
    tally = result.tallies["agentspec"]
    return tally.drafted_tokens, tally.accepted_tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: build the tiny test model)")
    p.add_argument("--cache-dir", default=os.environ.get(ENV_DIR), help="where the tiny model is built")
    p.add_argument("--concurrency", default="1,4,8,16,32", help="comma-separated session counts")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--siblings", type=int, default=2, help="sessions per group (sharing their first prompt)")
    p.add_argument("--max-tokens", type=int, default=40)
    args = p.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]

    model = Path(args.model) if args.model else build_tiny_model(args.cache_dir or tempfile.mkdtemp())
    work = Path(tempfile.mkdtemp(prefix="agentspec-fidelity-"))
    config = IndexConfig()
    settings = EngineSettings(index=config, step_log_dir=str(work / "steps"))
    server = VLLMServer.launch(model, agentspec=True, settings=settings, log_dir=work)
    rows = []
    try:
        server.wait_ready(400)
        for c in levels:
            tag = f"fid{c}-{uuid.uuid4().hex[:6]}"
            workload = AgentWorkload(sessions=c, turns=args.turns, siblings=args.siblings, max_tokens=args.max_tokens)
            calls = run_agents(server.url, server.model, workload, salt=tag, tag=tag)
            events, logged, order = logged_calls(server.step_log_dir, calls)  # type: ignore[arg-type]
            sessions = {call.session for call in calls}
            server_d, server_a = _server_totals(server.url, sessions, tag)
            steps = replay_steps(events, as_logged(logged), DraftIndex(config))
            step_d = sum(steps.session_totals(s)[0] for s in sessions)
            step_a = sum(steps.session_totals(s)[1] for s in sessions)
            bench_d, bench_a = _bench_totals(logged, order, config)
            lock_d, lock_a = _lockstep_totals(calls, c, config)
            differ = len({m.step for m in steps.mismatches})
            rows.append((c, steps.max_batch, steps.limited_rows / max(1, steps.rows), server_d, server_a,
                         step_d, step_a, differ, bench_d, bench_a, lock_d, lock_a))  # fmt: skip
            print(f"concurrency {c}: done", flush=True)
    finally:
        server.stop()

    print(
        f"\n{args.turns} turns x {args.max_tokens} tokens per session, groups of {args.siblings};"
        " draft/accepted tokens\n"
    )
    head = (
        "C",
        "max batch",
        "rows cut",
        "server",
        "steps",
        "differ",
        "bench",
        "lockstep",
        "bench/server",
        "lockstep/server",
    )
    print("{:>4} {:>9} {:>8} {:>13} {:>13} {:>6} {:>13} {:>13} {:>12} {:>15}".format(*head))
    for c, batch, cut, sd, sa, td, ta, differ, bd, ba, ld, la in rows:
        bench = f"{ba / sa:.3f}" if sa else "-"
        lock = f"{la / sa:.3f}" if sa else "-"
        print(f"{c:>4} {batch:>9} {cut:>8.0%} {f'{sd}/{sa}':>13} {f'{td}/{ta}':>13} {differ:>6} {f'{bd}/{ba}':>13}"
              f" {f'{ld}/{la}':>13} {bench:>12} {lock:>15}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
