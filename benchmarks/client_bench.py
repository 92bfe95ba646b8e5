"""Client benchmark: per-call overhead against the plain ``openai`` SDK, and pinning spread.

1. Overhead. The same chat call, made N times through ``openai.OpenAI`` and through an
   agentspec session, against the same server in the same run (blocks interleaved so drift
   hits both alike). The default server is agentspec's stub (a real HTTP server that answers
   at once), which isolates client cost; ``--url`` adds a real server (vLLM or
   ``agentspec serve``), where generation time dominates.
2. Spread. 10,000 simulated sessions pinned over ``--backends`` backends by rendezvous
   hashing with bounded load (the client's own :class:`~agentspec.client.routing.PinTable`)
   and, for comparison, without the bound: max/mean load.

    python benchmarks/client_bench.py [--calls 400] [--url http://host:8000 --model NAME]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from agentspec.client import AgentSpecClient, ClientConfig
from agentspec.client.routing import PinTable, rendezvous_order
from agentspec.testing.stub import StubServer

MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test in utils.py."},
]


def _serve_stub(port_out: multiprocessing.connection.Connection) -> None:  # pragma: no cover
    stub = StubServer(name="bench").start()
    port_out.send((stub.url, stub.model))
    while True:
        time.sleep(3600)


@contextmanager
def stub_process() -> Iterator[tuple[str, str]]:
    """The stub in its own process: in a thread it would share the GIL with the clients
    being measured, and the measurement would include the server's cost."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_serve_stub, args=(send,), daemon=True)
    proc.start()
    try:
        if not recv.poll(60):
            raise RuntimeError("the stub server did not start")
        yield recv.recv()
    finally:
        proc.terminate()
        proc.join(10)


def _time_per_call(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def overhead(url: str, model: str, calls: int, max_tokens: int, blocks: int = 4) -> dict[str, float]:
    """Median seconds per call for both clients and their ratio (agentspec / openai)."""
    import openai

    oa = openai.OpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0)
    config = ClientConfig(backends=[url], model=model, api_key="bench", health_check_interval_s=None)
    with AgentSpecClient(config) as client, client.session(group_id="bench") as session:

        def plain() -> object:
            return oa.chat.completions.create(
                model=model,
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                temperature=0.0,
            )

        def ours() -> object:
            return session.chat(MESSAGES, max_tokens=max_tokens, temperature=0.0)

        # Warm both connection pools and code paths.
        _time_per_call(plain, 10)
        _time_per_call(ours, 10)
        t_plain: list[float] = []
        t_ours: list[float] = []
        per_block = max(1, calls // blocks)
        for _ in range(blocks):
            t_plain += _time_per_call(plain, per_block)
            t_ours += _time_per_call(ours, per_block)
    oa.close()
    p, o = statistics.median(t_plain), statistics.median(t_ours)
    return {
        "calls": len(t_ours),
        "openai_ms": p * 1e3,
        "agentspec_ms": o * 1e3,
        "ratio": o / p,
        "overhead_ms": (o - p) * 1e3,
        "session_turns": len(session.turns),
    }


def spread(n_sessions: int, n_backends: int, factor: float, group_size: int = 1) -> dict[str, float]:
    """Load spread of ``n_sessions`` pinned over ``n_backends`` (groups of ``group_size``)."""
    backends = [f"http://10.0.0.{i}:8000" for i in range(n_backends)]
    table = PinTable(load_factor=factor)
    for i in range(n_sessions):
        group = f"group-{i // group_size}"
        table.register(group)
        table.resolve(group, backends)
    loads = [table.loads().get(b, 0) for b in backends]
    # Plain rendezvous (no bound), same keys: what the bound buys.
    plain = dict.fromkeys(backends, 0)
    for g in range((n_sessions + group_size - 1) // group_size):
        size = min(group_size, n_sessions - g * group_size)
        plain[rendezvous_order(f"group-{g}", backends)[0]] += size
    mean = n_sessions / n_backends
    return {
        "sessions": n_sessions,
        "backends": n_backends,
        "group_size": group_size,
        "factor": factor,
        "bounded_max_over_mean": max(loads) / mean,
        "unbounded_max_over_mean": max(plain.values()) / mean,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=400, help="calls per client (default 400)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--url", help="also measure against this server (vLLM / agentspec serve)")
    ap.add_argument("--model", default=None, help="model name on --url")
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--backends", type=int, default=8)
    ap.add_argument("--factor", type=float, default=1.25)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    results: dict[str, Any] = {}
    with stub_process() as (url, model):
        results["overhead_stub"] = overhead(url, model, args.calls, args.max_tokens)
    if args.url:
        if not args.model:
            ap.error("--url needs --model")
        results["overhead_server"] = overhead(args.url, args.model, max(20, args.calls // 10), args.max_tokens)
    results["spread"] = [
        spread(args.sessions, args.backends, args.factor),
        spread(args.sessions, args.backends, args.factor, group_size=8),
        # Few sessions: where plain hashing is lumpy and the bound earns its keep.
        spread(100, args.backends, args.factor),
    ]

    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for key in ("overhead_stub", "overhead_server"):
        if key in results:
            r = results[key]
            print(
                f"{key}: {r['calls']} calls each, median per call: openai {r['openai_ms']:.3f} ms, "
                f"agentspec {r['agentspec_ms']:.3f} ms, ratio {r['ratio']:.2f} "
                f"(+{r['overhead_ms']:.3f} ms)"
            )
    for s in results["spread"]:
        print(
            f"spread: {s['sessions']} sessions in groups of {s['group_size']} over {s['backends']} "
            f"backends: max/mean {s['bounded_max_over_mean']:.3f} with bound {s['factor']}, "
            f"{s['unbounded_max_over_mean']:.3f} without"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
