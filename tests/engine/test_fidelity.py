"""The replay drafts what the server drafted.

A multi-turn, multi-session workload goes through the real ``agentspec serve``, one call at
a time, as token ids (sessions and groups named as clients name them). The server's own
transcript (prompt and output token ids of every call) is then replayed offline through
the replay benchmark's agentspec proposer and loop (``agentspec.replay``). The server's
per-session statistics and the replay's counts must be equal: the benchmark runs the code
the server runs, with the same index settings.

The one-call-at-a-time comparison runs on a server under the fixed batch rule, which cuts
nothing at batch 1: the default cost budget prices tokens by the step times it measures as
it runs, which no offline replay can know. At higher concurrency, on the default server,
the cost budget cuts drafts and calls in flight see each other's text; the server's step
log (``agentspec.engine.worker.step_log``) records each step's batch, caps and cut, and
``agentspec.replay.step_replay`` redoes the steps from it: equal, step by step.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

import httpx
import numpy as np
import pytest
from engine_helpers import MODEL

from agentspec import wire
from agentspec.engine.settings import EngineSettings
from agentspec.index import DraftIndex
from agentspec.replay.calls import CallSpec
from agentspec.replay.driver_proposer import DriverProposer
from agentspec.replay.simulate import Tally, replay_call
from agentspec.replay.step_replay import replay_steps
from agentspec.testing.fidelity import (
    AgentCall,
    AgentWorkload,
    as_logged,
    complete,
    logged_calls,
    run_agents,
)
from agentspec.testing.pytest_plugin import TEST_INDEX_CONFIG, server_fixture
from agentspec.testing.server_kinds import ServerKind
from agentspec.testing.stats import metric_value, scrape

pytestmark = pytest.mark.server

batch_rule_server = server_fixture(
    ServerKind(
        "agentspec-batch-rule",
        "``agentspec serve --agentspec-draft-budget batch``: the fixed rule, no cut at batch 1",
        lambda c: EngineSettings(index=TEST_INDEX_CONFIG, draft_budget="batch"),
    )
)

SESSIONS, TURNS, MAX_TOKENS = 3, 4, 40


def _run_workload(base: str, salt: str, tag: str) -> list[AgentCall]:
    """Agent loops: each turn's prompt is the history plus an observation quoting the last
    output, as tool results and file views do. Sessions take turns one call at a time."""
    rng = np.random.default_rng(7)
    histories = {f"fid-{tag}-{s}": [int(t) for t in rng.integers(100, 900, 24)] for s in range(SESSIONS)}
    calls: list[AgentCall] = []
    for turn in range(TURNS):
        for s, (session, history) in enumerate(histories.items()):
            group = f"fid-{tag}-g{s % 2}"
            output = complete(base, MODEL, history, MAX_TOKENS, session=session, group=group, salt=salt)
            calls.append(AgentCall(session, group, turn, list(history), output))
            observation = [int(t) for t in rng.integers(100, 900, 6)]
            history += output + observation + output[: MAX_TOKENS // 2]
    return calls


def _replay(calls: list[AgentCall]) -> dict[str, Tally]:
    proposer = DriverProposer(DraftIndex(TEST_INDEX_CONFIG))
    tallies: dict[str, Tally] = defaultdict(Tally)
    for n, call in enumerate(calls):
        spec = CallSpec(f"c{n}", call.session, call.group, call.session, call.turn, "server")
        output = np.asarray(call.output, dtype=np.int32)
        replay_call(proposer, spec, np.asarray(call.prompt, dtype=np.int32), output, call.output, tallies[call.session])
    return tallies


def _stats(base: str, session: str, salt: str) -> dict[str, int]:
    """The session's statistics once all its calls are published (a moment after each step)."""
    deadline = time.monotonic() + 15
    while True:
        r = httpx.get(base + wire.SESSION_STATS_PATH + session, params={wire.CACHE_SALT_FIELD: salt}, timeout=10)
        if r.status_code == 200 and r.json()["calls"] >= TURNS:
            return dict(r.json())
        assert time.monotonic() < deadline, (session, r.status_code, r.text)
        time.sleep(0.2)


def test_the_replay_counts_what_the_server_counted(batch_rule_server) -> None:
    base = batch_rule_server.url
    tag = uuid.uuid4().hex[:8]
    # A tenant of its own (cache_salt): its global corpus starts empty, as the replay's does.
    salt = f"fidelity-{tag}"
    calls = _run_workload(base, salt, tag)
    replayed = _replay(calls)
    for session, tally in replayed.items():
        stats = _stats(base, session, salt)
        server = (stats["draft_tokens"], stats["accepted_tokens"])
        assert server == (tally.drafted_tokens, tally.accepted_tokens), (session, server, tally)
    # Drafting really happened, at every level the workload reaches.
    assert sum(t.accepted_tokens for t in replayed.values()) > SESSIONS * TURNS * 5


def test_the_step_replay_equals_the_server_at_concurrency(agentspec_server) -> None:
    """Many sessions at once under the cost budget, which prices their draft tokens by the
    step times it measures; siblings of a group share their first prompt and run at the
    same time."""
    base = agentspec_server.url
    tag = f"fidc-{uuid.uuid4().hex[:8]}"
    salt = f"fidelity-{tag}"  # a tenant of its own, as above
    # 20 sessions: their requests reach the engine over a few steps (more so while another
    # server starts beside it), so fewer than all run at once.
    calls = run_agents(base, MODEL, AgentWorkload(sessions=20, turns=TURNS, max_tokens=MAX_TOKENS), salt=salt, tag=tag)
    events, logged, _ = logged_calls(agentspec_server.step_log_dir, calls)

    replayed = replay_steps(events, as_logged(logged), DraftIndex(TEST_INDEX_CONFIG))
    # Step by step: the same tokens emitted and the same draft lengths for every request.
    assert replayed.mismatches == []
    assert replayed.rows > len(calls) * 5
    # The cost budget really priced drafts: it timed steps, some steps' cut was above the
    # policy's own, and the cut took tokens off (what the replay redid exactly, above).
    assert replayed.max_batch > 8
    (start,) = [e for e in events if e["e"] == "start"]
    assert start.get("calibrated") is True
    assert any(e.get("min_prob", 0.0) > 0.1 for e in events if e["e"] == "step")
    metrics = scrape(base)
    assert metric_value(metrics, "agentspec_step_cost_timed_steps") > 0
    assert metric_value(metrics, "agentspec_step_cost_token_seconds") > 0
    assert metric_value(metrics, "agentspec_budget_cut_tokens_total") > 0
    sessions = {c.session for c in calls}
    for session in sessions:
        stats = _stats(base, session, salt)
        assert (stats["draft_tokens"], stats["accepted_tokens"]) == replayed.session_totals(session), session
    assert sum(replayed.session_totals(s)[1] for s in sessions) > len(calls) * 5
