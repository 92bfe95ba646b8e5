"""Throughput of the Redis exchange: can one replica publish and ingest as fast as an engine
finishes outputs?

    python benchmarks/exchange_throughput.py [--outputs 20000] [--tokens 400] [--peers 7]
        [--redis redis://HOST:PORT/DB] [--json FILE]

One replica publishes ``--outputs`` outputs of ``--tokens`` tokens as fast as it can (the
engine's side of :meth:`RedisExchange.publish` is a queue append; its writer thread sends
pipelined ``XADD``). ``--peers`` other replicas read them all, as a fleet of that size
would. Prints outputs per second sent by the publisher and taken in by the slowest reader,
and sets them against an engine's output rate from the speed model (agentspec.draft_budget.speed_model): an
8B model on an H100 at 64 requests in flight, each output ``--tokens`` long. Without
``--redis`` it starts a ``redis-server`` of its own (Debian's package) on loopback, so the
figures are this machine's loopback, not a network's.

It also times what the engine's thread pays to take outputs in: indexing ``--catch-up``
outputs (one poll's worth, as after a restart or an outage) into a draft index's global
corpus, per token, against the step budget (``EngineSettings.exchange_step_budget_s``) that
spreads such a catch-up over steps.

``--json FILE`` writes the same figures, with the settings and the machine's load
(docs/fleet.md's "Is Redis the bottleneck?").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np

from agentspec import DraftIndex
from agentspec.draft_budget.speed_model import parse_speed_model
from agentspec.engine.exchange import RedisExchange, RedisExchangeConfig
from agentspec.engine.settings import EngineSettings
from agentspec.testing.redis_server import RedisServer

CONTEXT = 16_000  # tokens of context per request for the engine's rate (agent calls are long)


def engine_outputs_per_s(concurrency: int, tokens: int, spec: str = "h100:8b") -> float:
    """Outputs per second an engine finishes, without speculation (the exchange's load
    grows with outputs, not with how fast each was drafted; speculation multiplies this by
    its speed-up)."""
    return parse_speed_model(spec).tokens_per_second(concurrency, CONTEXT) / tokens


def run(url: str, outputs: int, tokens: int, peers: int) -> dict[str, float]:
    config = RedisExchangeConfig.parse(url + ("&" if "?" in url else "?") + f"stream=bench-{time.time_ns()}")
    # Large queues: the benchmark measures the transport, not its drop policy.
    publisher = RedisExchange(config, "publisher", "bench:1", max_pending=outputs)
    readers = [RedisExchange(config, f"reader-{i}", "bench:1", max_inbound=outputs) for i in range(peers)]
    rng = np.random.default_rng(0)
    batch = [rng.integers(0, 150_000, tokens, dtype=np.int32) for _ in range(64)]
    try:
        t0 = time.perf_counter()
        for i in range(outputs):
            publisher.publish(batch[i % len(batch)], "tenant", 3, "group")
        queued_s = time.perf_counter() - t0
        if not publisher.wait_idle(600):
            raise SystemExit("the publisher did not finish sending within 10 minutes")
        sent_s = time.perf_counter() - t0
        got = [0] * peers
        deadline = time.monotonic() + 600
        while min(got, default=outputs) < outputs and time.monotonic() < deadline:
            for i, reader in enumerate(readers):
                got[i] += len(reader.poll())
            time.sleep(0.005)
        read_s = time.perf_counter() - t0
        if min(got, default=outputs) < outputs:
            raise SystemExit(f"readers took in {min(got)} of {outputs} outputs within 10 minutes")
    finally:
        for ex in (publisher, *readers):
            ex.close(timeout=1)
    return {
        "publish_call_us": queued_s / outputs * 1e6,
        "sent_per_s": outputs / sent_s,
        "read_per_s": outputs / read_s,
    }


def index_cost(outputs: int, tokens: int) -> dict[str, float]:
    """Seconds to index ``outputs`` peer outputs of ``tokens`` tokens into a fresh index's
    global corpus (the default configuration), and microseconds per token."""
    rng = np.random.default_rng(1)
    # Token ids from a narrow range, so that outputs share substrings as agent text does.
    texts = [rng.integers(0, 5_000, tokens, dtype=np.int32) for _ in range(outputs)]
    index = DraftIndex()
    t0 = time.perf_counter()
    added = sum(index.add_peer_output(text) for text in texts)
    elapsed = time.perf_counter() - t0
    return {"catch_up_s": elapsed, "us_per_token": elapsed / added * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outputs", type=int, default=20_000)
    parser.add_argument("--tokens", type=int, default=400, help="tokens per output")
    parser.add_argument("--peers", type=int, default=7, help="readers besides the publisher")
    parser.add_argument("--redis", help="a Redis URL; default: a redis-server started here")
    parser.add_argument("--catch-up", type=int, default=2_048, help="outputs indexed at once (one poll's most)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    server = None if args.redis else RedisServer().start()
    try:
        figures = run(args.redis or server.url, args.outputs, args.tokens, args.peers)  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.close()
    engine = engine_outputs_per_s(64, args.tokens)
    mib = args.tokens * 4 / 2**20
    print(f"{args.outputs} outputs of {args.tokens} tokens, 1 publisher, {args.peers} readers")
    print(f"  publish() on the engine thread: {figures['publish_call_us']:.1f} us per output")
    print(f"  sent to Redis:          {figures['sent_per_s']:9.0f} outputs/s ({figures['sent_per_s'] * mib:.0f} MiB/s)")
    print(f"  read by every reader:   {figures['read_per_s']:9.0f} outputs/s")
    print(
        f"  engine (speed model: h100:8b, 64 in flight, {CONTEXT} tokens of context): {engine * args.tokens:.0f}"
        f" tokens/s = {engine:.1f} outputs/s"
    )
    print(f"  headroom: sent {figures['sent_per_s'] / engine:.0f}x, read {figures['read_per_s'] / engine:.0f}x")
    cost = index_cost(args.catch_up, args.tokens)
    budget_s = EngineSettings.model_fields["exchange_step_budget_s"].default
    per_step = budget_s / (cost["us_per_token"] * 1e-6)
    print(f"indexing peers' outputs on the engine's thread: {cost['us_per_token']:.2f} us per token")
    print(f"  {args.catch_up} outputs at once: {cost['catch_up_s'] * 1e3:.0f} ms in one step if not spread")
    print(
        f"  step budget {budget_s * 1e3:.0f} ms: about {per_step:.0f} tokens per step"
        f" ({per_step / args.tokens:.0f} outputs): the catch-up takes"
        f" {max(1, math.ceil(cost['catch_up_s'] / budget_s))} steps"
    )
    if args.json is not None:
        out = {
            "settings": {
                "outputs": args.outputs,
                "tokens": args.tokens,
                "peers": args.peers,
                "catch_up": args.catch_up,
                "redis": "given" if args.redis else "redis-server on loopback",
                "cpus": len(os.sched_getaffinity(0)),
                "load_average": list(os.getloadavg()),
            },
            "transport": figures,
            "engine": {"spec": "h100:8b", "concurrency": 64, "context": CONTEXT, "outputs_per_s": engine},
            "catch_up": {
                **cost,
                "step_budget_s": budget_s,
                "tokens_per_step": per_step,
                "outputs_per_step": per_step / args.tokens,
            },
        }
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
