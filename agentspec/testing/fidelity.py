"""A concurrent agent workload for checking the replay against a real server.

Sessions run side by side, each one turn after another (an agent loop: the next prompt is
the history, the last output, an observation and a quote of the output, as tool results
and file views quote), sent as token ids with session and group headers. Siblings of a
group start from the same prompt, as a GRPO group's samples do. The server must log its
steps (``EngineSettings.step_log_dir``); :func:`logged_calls` pairs its log with the
calls, for :func:`agentspec.replay.step_replay.replay_steps`.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from agentspec import wire
from agentspec.engine.worker.step_log import read_step_log
from agentspec.replay.step_replay import LoggedCall, requests_by_session


@dataclass(frozen=True)
class AgentCall:
    """One call of the workload: who sent it and its token ids."""

    session: str
    group: str
    turn: int
    prompt: list[int]
    output: list[int]


@dataclass(frozen=True)
class AgentWorkload:
    """How many sessions run at once, in groups of ``siblings``, for ``turns`` turns."""

    sessions: int
    turns: int = 3
    siblings: int = 3
    max_tokens: int = 40
    prompt_tokens: int = 24
    observation_tokens: int = 6


def complete(
    base: str, model: str, prompt: list[int], max_tokens: int, *, session: str, group: str, salt: str
) -> list[int]:
    """One greedy completion of exactly ``max_tokens`` tokens; its output token ids."""
    response = httpx.post(
        base + "/v1/completions",
        json={
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,  # every output is max_tokens long: no stop to model
            "return_token_ids": True,
            wire.CACHE_SALT_FIELD: salt,
        },
        headers={wire.SESSION_HEADER: session, wire.GROUP_HEADER: group},
        timeout=300,
    )
    if response.status_code != 200:
        raise RuntimeError(f"completion failed ({response.status_code}): {response.text[:500]}")
    return [int(t) for t in response.json()["choices"][0]["token_ids"]]


def run_agents(base: str, model: str, workload: AgentWorkload, *, salt: str, tag: str) -> list[AgentCall]:
    """Run ``workload`` against the server at ``base``: every session in its own thread,
    all starting together. ``salt`` (cache_salt) names the tenant; ``tag`` makes the
    session and group ids unique."""
    start = threading.Barrier(workload.sessions)

    def agent(s: int) -> list[AgentCall]:
        group = f"{tag}-g{s // workload.siblings}"
        first = np.random.default_rng(s // workload.siblings).integers(100, 900, workload.prompt_tokens)
        history = [int(t) for t in first]
        rng = np.random.default_rng(1000 + s)  # observations differ between siblings
        session, calls = f"{tag}-{s}", []
        start.wait(timeout=120)
        for turn in range(workload.turns):
            output = complete(base, model, history, workload.max_tokens, session=session, group=group, salt=salt)
            calls.append(AgentCall(session, group, turn, list(history), output))
            observation = [int(t) for t in rng.integers(100, 900, workload.observation_tokens)]
            history = history + output + observation + output[: workload.max_tokens // 2]
        return calls

    with ThreadPoolExecutor(workload.sessions) as pool:
        return [call for calls in pool.map(agent, range(workload.sessions)) for call in calls]


def logged_calls(
    step_log_dir: str | Path, calls: list[AgentCall], timeout: float = 30.0
) -> tuple[list[dict[str, Any]], dict[str, AgentCall], list[str]]:
    """The server's step log once every call's end is in it; the calls by logged request
    id (a session's n-th logged request is its n-th call); and those ids in arrival order."""
    (path,) = sorted(Path(step_log_dir).glob("steps-*.jsonl"))  # one drafting worker
    sessions = {c.session for c in calls}
    deadline = time.monotonic() + timeout
    while True:
        events = read_step_log(path)
        by_session = {s: reqs for s, reqs in requests_by_session(events).items() if s in sessions}
        ended = {r for e in events if e.get("e") == "end" for r in e["req"]}
        ours = {r for reqs in by_session.values() for r in reqs}
        if len(ours) == len(calls) and ended >= ours:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(ours)} of {len(calls)} calls in the step log, {len(ended & ours)} ended")
        time.sleep(0.2)
    per_session: dict[str, list[AgentCall]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c.turn):
        per_session[call.session].append(call)
    logged = {
        req: call for session, reqs in by_session.items() for req, call in zip(reqs, per_session[session], strict=True)
    }
    order = [e["req"] for e in events if e.get("e") == "add" and e["req"] in ours]
    return events, logged, order


def as_logged(calls: dict[str, AgentCall]) -> dict[str, LoggedCall]:
    """What :func:`~agentspec.replay.step_replay.replay_steps` takes: token ids by request id."""
    return {req: LoggedCall(call.prompt, call.output) for req, call in calls.items()}
