"""Multi-turn agent workload through plain vLLM, vLLM's suffix and draft-model methods,
``agentspec serve`` and ``agentspec serve --agentspec-drafter`` (hybrid), on the same
model, in one run; prints each server's figures and ratios to vLLM's suffix method.

    python benchmarks/engine_bench.py [--model DIR] [--drafter DIR] [--sessions 8] [--turns 6] [--concurrency 4]

Without ``--model`` it builds the tiny test model (agentspec.testing.tiny_model) into
``--cache-dir`` (default ``$AGENTSPEC_TINY_MODEL_DIR`` or a temporary folder); without
``--drafter`` it builds the tiny model's draft model (its first two layers). Each session
is an agent loop: turn k's prompt is the whole history (earlier prompts and the model's
own outputs) plus a new observation that quotes the previous output, as tool results and
file views do. Every server gets the identical workload, one server at a time (they
never compete for the machine); greedy outputs are compared too.

Reported per server, from vLLM's own ``/metrics`` counters over the workload: accepted
tokens per draft step (``spec_decode_num_accepted_tokens / num_drafts``), the acceptance
rate, and wall time per output token; for the hybrid also the draft paths taken and the
draft model's time (agentspec's counters; vLLM exports no drafter time, so the
``vllm-draft-model`` server's drafter cost shows only in its wall time). On the tiny
random model on a CPU a draft model costs about what the target does (two layers of
four), so wall times say nothing about a GPU deployment, and a truncated random model
agrees with its target less than a trained drafter would; the accepted-token figures show
what each method drafts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from agentspec.engine.settings import DrafterSettings, EngineSettings
from agentspec.testing.server import VLLMServer
from agentspec.testing.tiny_model import ENV_DIR, build_tiny_drafter, build_tiny_model

OPENERS = [
    "Fix the failing test in parser.py; the traceback says IndexError at line 42.",
    "List the files in the repository and find where the config is loaded.",
    "The build fails with 'undefined symbol'. Investigate and propose a patch.",
    "Refactor the retry loop in client.py to use exponential backoff.",
    "Write a unit test for the tokenize() function covering empty input.",
    "Find why the server returns 500 on /health after a restart.",
    "Rename the function load_cfg to load_config everywhere.",
    "Summarize the changes in the last three commits.",
]


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key = line.split(" ")[0]
            if key == name or key.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _spec_counters(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=30).text
    return {
        "drafts": _metric(text, "vllm:spec_decode_num_drafts_total"),
        "draft_tokens": _metric(text, "vllm:spec_decode_num_draft_tokens_total"),
        "accepted": _metric(text, "vllm:spec_decode_num_accepted_tokens_total"),
    }


def _session(base: str, sid: str, opener: str, turns: int, max_tokens: int) -> tuple[list[list[int]], int]:
    messages = [{"role": "system", "content": "You are a coding agent. Use the tools."},
                {"role": "user", "content": opener}]  # fmt: skip
    outputs: list[list[int]] = []
    produced = 0
    for turn in range(turns):
        r = httpx.post(
            base + "/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0,
                "return_token_ids": True,
            },
            headers={"X-Session-Id": sid},
            timeout=300,
        )
        r.raise_for_status()
        choice = r.json()["choices"][0]
        outputs.append(choice["token_ids"])
        produced += r.json()["usage"]["completion_tokens"]
        text = choice["message"]["content"] or ""
        observation = f"Tool output (step {turn}):\n{text}\n---\n{OPENERS[(turn + 3) % len(OPENERS)]}"
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": observation},
        ]
    return outputs, produced


def run_workload(base: str, args: argparse.Namespace) -> dict[str, Any]:
    before = _spec_counters(base)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(
            pool.map(
                lambda i: _session(
                    base,
                    f"bench-{i}",
                    OPENERS[i % len(OPENERS)] + f" (task {i})",
                    args.turns,
                    args.max_tokens,
                ),
                range(args.sessions),
            )
        )
    wall = time.perf_counter() - start
    after = _spec_counters(base)
    delta = {k: after[k] - before[k] for k in before}
    tokens = sum(n for _, n in results)
    return {
        "outputs": [o for o, _ in results],
        "output_tokens": tokens,
        "wall_s": wall,
        "s_per_token": wall / max(tokens, 1),
        "accepted_per_draft": delta["accepted"] / max(delta["drafts"], 1),
        "acceptance_rate": delta["accepted"] / max(delta["draft_tokens"], 1),
        **delta,
    }


SERVERS = ("plain", "vllm-suffix", "vllm-draft-model", "agentspec", "agentspec+drafter")


def _launch(name: str, model: Path, drafter: Path, args: argparse.Namespace, log_dir: str) -> VLLMServer:
    k = args.drafter_tokens
    if name == "plain":
        return VLLMServer.launch(model, agentspec=False, log_dir=log_dir)
    if name == "vllm-suffix":
        spec = {"method": "suffix"}
        return VLLMServer.launch(
            model,
            agentspec=False,
            log_dir=log_dir,
            extra_args=["--speculative-config", json.dumps(spec)],
        )
    if name == "vllm-draft-model":
        spec = {
            "method": "draft_model",
            "model": str(drafter),
            "num_speculative_tokens": k,
        }
        extra = ["--speculative-config", json.dumps(spec), "--no-async-scheduling"]
        return VLLMServer.launch(model, agentspec=False, log_dir=log_dir, extra_args=extra)
    settings = EngineSettings()
    if name == "agentspec+drafter":
        settings = EngineSettings(drafter=DrafterSettings(model=str(drafter), num_tokens=k))
    return VLLMServer.launch(model, agentspec=True, settings=settings, log_dir=log_dir)


def _hybrid_counters(base: str) -> dict[str, float]:
    engine = httpx.get(base + "/agentspec/v1/stats", timeout=30).json().get("engine", {})
    keys = [f"{p}_{k}" for p in ("suffix", "model", "none") for k in ("drafts_total", "accepted_tokens_total")]
    return {
        k: float(engine.get(k, 0))
        for k in [
            *keys,
            "drafter_runs_total",
            "drafter_runs_skipped_total",
            "drafter_seconds_total",
        ]
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: build the tiny test model)")
    p.add_argument(
        "--drafter",
        help="draft model folder (default: the tiny model's first two layers)",
    )
    p.add_argument("--drafter-tokens", type=int, default=4, help="draft model's tokens per step")
    p.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help=f"comma-separated, of {', '.join(SERVERS)}",
    )
    p.add_argument(
        "--cache-dir",
        default=os.environ.get(ENV_DIR),
        help="where the tiny model is built",
    )
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--log-dir", help="server logs (default: a temporary folder)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SERVERS))
    if unknown:
        p.error(f"unknown servers: {', '.join(unknown)} (choose from {', '.join(SERVERS)})")

    model = Path(args.model) if args.model else build_tiny_model(args.cache_dir or tempfile.mkdtemp())
    drafter = Path(args.drafter) if args.drafter else build_tiny_drafter(model)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="agentspec-bench-")
    print(
        f"model {model}, drafter {drafter} ({args.drafter_tokens} tokens); {args.sessions} sessions x"
        f" {args.turns} turns, {args.max_tokens} tokens per turn, concurrency {args.concurrency}",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        # One server at a time, so they never compete for the machine.
        server = _launch(name, model, drafter, args, log_dir)
        try:
            server.wait_ready(400)
            run_workload(
                server.url,
                argparse.Namespace(**{**vars(args), "sessions": 1, "turns": 1}),
            )  # warm-up
            before = _hybrid_counters(server.url) if name.startswith("agentspec") else {}
            results[name] = run_workload(server.url, args)
            if before:
                after = _hybrid_counters(server.url)
                results[name]["hybrid"] = {k: after[k] - before[k] for k in after}
        finally:
            server.stop()
        print(f"{name}: done", flush=True)

    base = results.get("vllm-suffix")
    print(f"\n{'':30}" + "".join(f"{n:>19}" for n in results))
    rows = [
        ("accepted tokens / draft step", "accepted_per_draft", "{:.2f}", 1.0),
        ("acceptance rate", "acceptance_rate", "{:.3f}", 1.0),
        ("draft steps", "drafts", "{:.0f}", 1.0),
        ("output tokens", "output_tokens", "{:.0f}", 1.0),
        ("wall ms / output token", "s_per_token", "{:.2f}", 1000.0),
    ]
    for label, key, fmt, scale in rows:
        cells = []
        for r in results.values():
            value = fmt.format(r[key] * scale)
            if base is not None and key in ("accepted_per_draft", "s_per_token") and base[key]:
                value += f" ({r[key] / base[key]:.2f}x)"
            cells.append(f"{value:>19}")
        print(f"{label:30}" + "".join(cells))
    hybrid = results.get("agentspec+drafter", {}).get("hybrid")
    if hybrid:
        print("\nagentspec+drafter paths (agentspec's counters over the workload):")
        for path in ("suffix", "model", "none"):
            drafts, acc = (
                hybrid[f"{path}_drafts_total"],
                hybrid[f"{path}_accepted_tokens_total"],
            )
            print(f"  {path:7} drafts {drafts:8.0f}   accepted tokens {acc:8.0f}")
        runs, skipped = (
            hybrid["drafter_runs_total"],
            hybrid["drafter_runs_skipped_total"],
        )
        print(f"  drafter: {runs:.0f} steps ran its draft passes, {skipped:.0f} skipped them;"
              f" {hybrid['drafter_seconds_total']:.2f} s in the draft model")  # fmt: skip
    if "vllm-draft-model" in results:
        print("vllm-draft-model: drafter time not reported (vLLM exports none); see its wall time")
    print("(ratios: to vllm-suffix)" if base is not None else "")
    outputs = [r["outputs"] for r in results.values()]
    same = all(o == outputs[0] for o in outputs)
    print(f"\ngreedy outputs identical across servers: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
