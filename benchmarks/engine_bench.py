"""Multi-turn agent workload through ``agentspec serve`` and through plain vLLM's suffix
decoding, on the same model, in one run; prints agentspec / vLLM-suffix ratios.

    python benchmarks/engine_bench.py [--model DIR] [--sessions 8] [--turns 6] [--concurrency 4]

Without ``--model`` it builds the tiny test model (agentspec.testing.tiny_model) into
``--cache-dir`` (default ``$AGENTSPEC_TINY_MODEL_DIR`` or a temporary folder). Each session
is an agent loop: turn k's prompt is the whole history (earlier prompts and the model's
own outputs) plus a new observation that quotes the previous output, as tool results and
file views do. Both servers get the identical workload; greedy outputs are compared too.

Reported per server, from vLLM's own ``/metrics`` counters over the workload:
accepted tokens per draft step (``spec_decode_num_accepted_tokens / num_drafts``) and wall
time per output token. On the tiny random model on a CPU the absolute numbers mean little;
the ratios show the effect of session memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from agentspec.testing.server import VLLMServer
from agentspec.testing.tiny_model import ENV_DIR, build_tiny_model

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
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": observation}]
    return outputs, produced


def run_workload(base: str, args: argparse.Namespace) -> dict[str, Any]:
    before = _spec_counters(base)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(
            pool.map(
                lambda i: _session(
                    base, f"bench-{i}", OPENERS[i % len(OPENERS)] + f" (task {i})", args.turns, args.max_tokens
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: build the tiny test model)")
    p.add_argument("--cache-dir", default=os.environ.get(ENV_DIR), help="where the tiny model is built")
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--log-dir", help="server logs (default: a temporary folder)")
    args = p.parse_args(argv)

    model = Path(args.model) if args.model else build_tiny_model(args.cache_dir or tempfile.mkdtemp())
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="agentspec-bench-")
    print(f"model {model}; {args.sessions} sessions x {args.turns} turns, {args.max_tokens} tokens per turn, "
          f"concurrency {args.concurrency}", flush=True)  # fmt: skip
    ours = VLLMServer.launch(model, agentspec=True, log_dir=log_dir)
    suffix = VLLMServer.launch(
        model, agentspec=False, log_dir=log_dir, extra_args=["--speculative-config", '{"method": "suffix"}']
    )
    try:
        ours.wait_ready(400)
        suffix.wait_ready(400)
        results = {}
        # One at a time, so the two servers never compete for the CPU.
        for name, server in (("vllm-suffix", suffix), ("agentspec", ours)):
            run_workload(server.url, argparse.Namespace(**{**vars(args), "sessions": 1, "turns": 1}))  # warm-up
            results[name] = run_workload(server.url, args)
    finally:
        ours.stop()
        suffix.stop()

    a, s = results["agentspec"], results["vllm-suffix"]
    print(f"\n{'':28}{'agentspec':>12}{'vllm-suffix':>13}{'ratio':>9}")
    rows = [
        ("accepted tokens / draft step", "accepted_per_draft", "{:12.2f}"),
        ("acceptance rate", "acceptance_rate", "{:12.3f}"),
        ("draft steps", "drafts", "{:12.0f}"),
        ("output tokens", "output_tokens", "{:12.0f}"),
        ("wall ms / output token", "s_per_token", "{:12.2f}"),
    ]
    for label, key, fmt in rows:
        av, sv = a[key] * (1000 if key == "s_per_token" else 1), s[key] * (1000 if key == "s_per_token" else 1)
        ratio = av / sv if sv else float("nan")
        print(f"{label:28}{fmt.format(av)}{fmt.format(sv)[-13:]:>13}{ratio:9.2f}")
    same = a["outputs"] == s["outputs"]
    print(f"\ngreedy outputs identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
