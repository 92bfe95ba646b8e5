"""Check agentspec on your GPU: is it in the loop, and does it change no output?

Start two servers of the same model on the GPU machine, then point this script at them:

    agentspec serve MODEL --port 8000 [--agentspec-drafter DRAFTER] [-tp N]
    vllm serve MODEL --port 8001 [-tp N]          # plain vLLM: the reference
    python examples/gpu_check.py --agentspec-url http://localhost:8000 --plain-url http://localhost:8001

Checks, each printed as one line (PASS / FAIL / SKIP):

- ``in the loop``: the agentspec server's engines publish agentspec's statistics (its
  workers refuse to start on a runner or drafter that is not agentspec's);
- ``greedy identity``: multi-turn repair loops at temperature 0 give the same tokens on
  both servers (under CUDA graphs and batching too); the first divergence is named, with
  its position, and never hidden: near-ties between two logits can flip on another kernel;
- ``drafting``: the repeated turns were drafted from the session's earlier text;
- on a CUDA machine only: ``soak`` (sessions in flight for ``--soak-s`` seconds, sampled:
  a tensor- or data-parallel hang shows as a request that never returns) and ``speed``
  (output tokens per second on both servers, for your information).

Exits 1 if a check fails. On a machine without CUDA the GPU-only checks are skipped.
"""

from __future__ import annotations

import importlib.util
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated

import httpx
import typer

from agentspec import wire
from agentspec.testing.stats import session_stats

#: Tasks whose answer a repair turn asks for again: the second and third answers repeat
#: much of the first, which is what the session's index drafts.
TASKS = (
    "Write a Python function `merge_intervals(intervals)` that merges overlapping intervals.",
    "Write a Python function `parse_duration(text)` that turns '1h30m' into seconds.",
    "Write a Python class `LRUCache` with get and put in O(1).",
    "Write a Python function `word_counts(path)` returning the 10 most common words of a file.",
)
REPAIR = "\n\nThe tests failed with an AssertionError. Fix the bug and write the whole answer again.\n\n"


@dataclass
class Turn:
    prompt: str
    token_ids: list[int]
    text: str


def _model(base: str, client: httpx.Client) -> str:
    return str(client.get(f"{base}/v1/models").raise_for_status().json()["data"][0]["id"])


def _complete(
    client: httpx.Client, base: str, model: str, prompt: str, max_tokens: int, session: str, temperature: float = 0.0
) -> Turn:
    r = client.post(
        f"{base}/v1/completions",
        json={
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "return_token_ids": True,
        },
        headers={wire.SESSION_HEADER: session},
    )
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return Turn(prompt, list(choice["token_ids"]), choice["text"])


def repair_loop(base: str, task: str, session: str, turns: int, max_tokens: int) -> list[Turn]:
    """One session: the task, then ``turns - 1`` repair requests carrying every earlier answer."""
    with httpx.Client(timeout=600) as client:
        model = _model(base, client)
        prompt, out = task + "\n\n", []
        for _ in range(turns):
            turn = _complete(client, base, model, prompt, max_tokens, session)
            out.append(turn)
            prompt = prompt + turn.text + REPAIR
        return out


def _run_sessions(base: str, turns: int, max_tokens: int, tag: str) -> tuple[list[list[Turn]], list[str], float]:
    sessions = [f"gpu-check-{tag}-{i}" for i in range(len(TASKS))]
    started = time.perf_counter()
    with ThreadPoolExecutor(len(TASKS)) as pool:
        loops = list(pool.map(lambda i: repair_loop(base, TASKS[i], sessions[i], turns, max_tokens), range(len(TASKS))))
    return loops, sessions, time.perf_counter() - started


def first_divergence(ours: list[list[Turn]], plain: list[list[Turn]]) -> str | None:
    """Where the agentspec server's tokens first differ from plain vLLM's, or None."""
    for task, (a_loop, b_loop) in enumerate(zip(ours, plain, strict=False)):
        for turn, (a, b) in enumerate(zip(a_loop, b_loop, strict=False)):
            if a.token_ids != b.token_ids:
                at = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y), None)
                at = min(len(a.token_ids), len(b.token_ids)) if at is None else at
                ours_token, plain_token = a.token_ids[at : at + 1], b.token_ids[at : at + 1]
                return f"task {task}, turn {turn + 1}, output token {at} ({ours_token} vs {plain_token})"
    return None


def soak(base: str, seconds: float, max_tokens: int, request_timeout_s: float) -> str | None:
    """Sampled sessions in flight for ``seconds``; a failure message, or None."""
    deadline = time.monotonic() + seconds
    errors: list[str] = []

    def worker(i: int) -> int:
        done = 0
        with httpx.Client(timeout=request_timeout_s) as client:
            model = _model(base, client)
            session, prompt = f"gpu-soak-{uuid.uuid4().hex[:8]}", TASKS[i % len(TASKS)] + "\n\n"
            while time.monotonic() < deadline:
                try:
                    turn = _complete(client, base, model, prompt, max_tokens, session, temperature=0.8)
                except httpx.HTTPError as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    return done
                prompt = (prompt + turn.text + REPAIR)[-8000:]
                done += 1
        return done

    with ThreadPoolExecutor(16) as pool:
        done = sum(pool.map(worker, range(16)))
    return f"{len(errors)} requests failed, first: {errors[0]}" if errors else (None if done else "no request finished")


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def main(
    agentspec_url: Annotated[str, typer.Option(help="The `agentspec serve` server.")],
    plain_url: Annotated[str, typer.Option(help="A plain `vllm serve` of the same model: the reference.")],
    turns: Annotated[int, typer.Option(min=2, help="Turns per repair loop.")] = 3,
    max_tokens: Annotated[int, typer.Option(min=1, help="Output tokens per turn.")] = 128,
    soak_s: Annotated[float, typer.Option(min=0, help="Seconds of the soak (CUDA only; 0: none).")] = 60.0,
    request_timeout_s: Annotated[float, typer.Option(help="A soak request slower than this counts as hung.")] = 300.0,
) -> None:
    """Check that agentspec is in the loop and changes no greedy output; see the module docstring."""
    failed = False

    def report(name: str, problem: str | None, detail: str = "", skip: str | None = None) -> None:
        nonlocal failed
        if skip is not None:
            typer.echo(f"SKIP  {name}: {skip}")
        elif problem is None:
            typer.echo(f"PASS  {name}" + (f": {detail}" if detail else ""))
        else:
            failed = True
            typer.echo(f"FAIL  {name}: {problem}")

    tag = uuid.uuid4().hex[:8]
    ours, sessions, ours_s = _run_sessions(agentspec_url, turns, max_tokens, tag)
    plain, _, plain_s = _run_sessions(plain_url, turns, max_tokens, tag)
    # After the sessions: the engines publish their statistics a moment after their steps.
    engine, status, deadline = None, 0, time.monotonic() + 10
    while not engine and time.monotonic() < deadline:
        stats = httpx.get(agentspec_url + wire.SERVER_STATS_PATH, timeout=30)
        status = stats.status_code
        if status != 200:
            break
        engine = stats.json().get("engine")
        time.sleep(0.5)
    problem = (
        f"{wire.SERVER_STATS_PATH} answered {status}: is this `agentspec serve`?"
        if status != 200
        else "no engine statistics: agentspec's plugin is not drafting in this server"
    )
    report("in the loop", None if engine else problem, f"{len(engine or {})} engine statistics")

    diverged = first_divergence(ours, plain)
    tokens = sum(len(t.token_ids) for loop in ours for t in loop)
    report("greedy identity", diverged and f"first divergence at {diverged}", f"{tokens} tokens equal")

    if engine:
        accepted = sum(
            int(
                (session_stats(agentspec_url, s, until=lambda st: st.get("calls", 0) >= turns) or {}).get(
                    "accepted_tokens", 0
                )
            )
            for s in sessions
        )
        problem = None if accepted > 0 else "no draft token was accepted in any repair loop"
        report("drafting", problem, f"{accepted} draft tokens accepted over {len(sessions)} sessions")
    else:
        report("drafting", None, skip="not an agentspec server")

    gpu_only = None if cuda_available() else "no CUDA device here (a GPU-only check)"
    if gpu_only is None and soak_s > 0:
        report("soak", soak(agentspec_url, soak_s, max_tokens, request_timeout_s), f"{soak_s:.0f} s, 16 sessions")
    else:
        report("soak", None, skip=gpu_only or "--soak-s 0")
    report(
        "speed",
        None,
        f"{tokens / ours_s:.1f} tokens/s with agentspec, {tokens / plain_s:.1f} plain ({plain_s / ours_s:.2f}x)",
        skip=gpu_only,
    )
    raise typer.Exit(1 if failed else 0)


if __name__ == "__main__":
    typer.run(main)
