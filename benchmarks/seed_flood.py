"""How much a flood of maximal text seeds slows everyone else, on a real ``agentspec serve``.

    python benchmarks/seed_flood.py [--model DIR] [--floods 4] [--probes 40]

Measures, against the same server in the same run, the latency of ``GET /health`` and of a
short chat call of another session, first alone and then while ``--floods`` clients keep
sending the largest text seed the character bound lets through to tokenizing (just under
32 characters per token of ``max_seed_tokens_per_request``; each is refused once over the
token limit). Prints the medians and the 95th percentiles, and their ratios flooded /
quiet: a server that tokenized seeds on its event loop stalls ``/health`` for seconds here.

Without ``--model`` it builds the tiny test model (agentspec.testing.tiny_model).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from agentspec import wire
from agentspec.testing.server import VLLMServer
from agentspec.testing.tiny_model import ENV_DIR, build_tiny_model

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}


def _latencies(client: httpx.Client, probes: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"health": [], "chat": []}
    for i in range(probes):
        t = time.perf_counter()
        assert client.get("/health").status_code == 200
        out["health"].append(time.perf_counter() - t)
        t = time.perf_counter()
        r = client.post("/v1/chat/completions", json=CHAT, headers={wire.SESSION_HEADER: f"probe-{i % 4}"})
        assert r.status_code == 200, r.text
        out["chat"].append(time.perf_counter() - t)
    return out


def _flood(base: str, stop: threading.Event, sent: list[int]) -> None:
    text = "word " * ((wire.CHARS_PER_TOKEN_BOUND * wire.MAX_SEED_TOKENS_PER_REQUEST - 1) // 5)
    body = {"agentspec_seeds": [{"text": text}]}
    with httpx.Client(base_url=base, timeout=120) as client:
        while not stop.is_set():
            r = client.post(wire.SEEDS_PATH, json=body, headers={wire.SESSION_HEADER: "flood"})
            assert r.status_code == 400, r.text  # over the token limit, found out by tokenizing
            sent.append(1)


def _summary(name: str, quiet: list[float], flooded: list[float]) -> str:
    def p95(xs: list[float]) -> float:
        return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]

    q50, f50 = statistics.median(quiet), statistics.median(flooded)
    return (
        f"{name:7s} median {q50 * 1e3:8.1f} ms quiet, {f50 * 1e3:8.1f} ms flooded ({f50 / q50:5.2f}x); "
        f"p95 {p95(quiet) * 1e3:8.1f} → {p95(flooded) * 1e3:8.1f} ms ({p95(flooded) / p95(quiet):5.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--floods", type=int, default=4)
    parser.add_argument("--probes", type=int, default=40)
    args = parser.parse_args()
    model = args.model or build_tiny_model(os.environ.get(ENV_DIR) or tempfile.mkdtemp(prefix="tiny-"))
    with VLLMServer.start(model, timeout=600) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        _latencies(client, 5)  # warm-up
        quiet = _latencies(client, args.probes)
        stop, sent = threading.Event(), []
        threads = [threading.Thread(target=_flood, args=(server.url, stop, sent)) for _ in range(args.floods)]
        for t in threads:
            t.start()
        time.sleep(2.0)  # let the floods start tokenizing
        try:
            flooded = _latencies(client, args.probes)
        finally:
            stop.set()
            for t in threads:
                t.join()
    print(f"{args.floods} clients sending maximal text seeds; {len(sent)} seeds refused during the run")
    for name in ("health", "chat"):
        print(_summary(name, quiet[name], flooded[name]))


if __name__ == "__main__":
    main()
