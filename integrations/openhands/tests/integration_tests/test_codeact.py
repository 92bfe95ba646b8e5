"""A real OpenHands CodeAct agent (terminal and file-editor tools) against a real
``agentspec serve`` on the tiny model: every call in one session, condensation and failed
commands seeded, statistics readable per conversation."""

from __future__ import annotations

import time
from typing import Any

import pytest
from codeact_harness import FAILING, CodeAct, wait_stats
from openhands.sdk.context.condenser import LLMSummarizingCondenser
from openhands.sdk.event import AgentErrorEvent, Condensation, ObservationEvent

from openhands_agentspec import conversation_stats
from openhands_agentspec.repair import failed

pytestmark = pytest.mark.server


def test_every_call_of_a_conversation_lands_in_its_session(codeact: CodeAct, agentspec_server: Any) -> None:
    task = codeact.task("oh-task-calls")
    attempt, run = codeact.run(task, steps=5)
    assert len(run.actions) == 5 and run.llm_calls() == 5
    assert {a.tool_name for a in run.actions} == {"terminal"}
    sid = str(attempt.conversation_id)
    stats = wait_stats(agentspec_server.url, sid, lambda s: s["calls"] >= 5)
    # One session named by OpenHands' own conversation id, in the task's group: the group
    # header never renamed it.
    assert stats["session_id"] == sid and stats["group_id"] == "oh-task-calls" and stats["calls"] == 5
    assert stats["indexed_tokens"] > 0 and stats["draft_tokens"] > 0
    # The same numbers through the integration.
    assert attempt.stats().calls == conversation_stats(task.llm(), sid).calls == 5


def test_a_condensation_seeds_the_forgotten_events(codeact: CodeAct, agentspec_server: Any) -> None:
    task = codeact.task("oh-task-condense")
    summariser = LLMSummarizingCondenser(llm=task.llm(usage_id="condenser"), max_size=8, keep_first=2)
    condenser = task.condenser(summariser)
    attempt, run = codeact.run(task, steps=7, condenser=condenser)
    condensations = [e for e in run.events if isinstance(e, Condensation)]
    assert condensations and condensations[0].forgotten_event_ids
    assert condenser.seeded_tokens > 0
    sid = str(attempt.conversation_id)
    # A condensation takes one of the run's steps; its summary call is in the session too
    # (it carries the conversation's id).
    assert run.llm_calls() == len(run.actions) + len(condensations) == 7
    stats = wait_stats(agentspec_server.url, sid, lambda s: s["calls"] >= run.llm_calls())
    assert stats["calls"] == run.llm_calls()
    assert stats["seeded_tokens_by_kind"].get("prior_turn") == condenser.seeded_tokens
    print(f"\none real conversation's server statistics: {stats}")


def test_a_failed_command_is_seeded_as_a_repair_attempt(codeact: CodeAct, agentspec_server: Any) -> None:
    task = codeact.task("oh-task-repair", command=FAILING)
    attempt, run = codeact.run(task, steps=4)
    assert len(run.actions) == 4
    results = [e for e in run.events if isinstance(e, ObservationEvent | AgentErrorEvent)]
    assert len(results) == 4
    # Every command is a `cat` of a missing file (exit code 1), but OpenHands' terminal
    # may report a command's exit code as unknown (-1: its prompt markers were not read
    # back in time), and the hook only seeds calls that are known to have failed.
    failures = [e for e in results if failed(e)]
    exit_codes = [getattr(getattr(e, "observation", None), "exit_code", None) for e in results]
    assert len(failures) >= 2, f"exit codes: {exit_codes}"
    # The seeder is a conversation callback, and each seed is a request to the server:
    # OpenHands may still be running the last one when the run returns.
    deadline = time.monotonic() + 30
    while attempt.repair.failed_calls < len(failures) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert attempt.repair.failed_calls == len(failures), f"exit codes: {exit_codes}"
    sid = str(attempt.conversation_id)
    stats = wait_stats(agentspec_server.url, sid, lambda s: s["calls"] >= 4)
    assert stats["seeded_tokens_by_kind"] == {"repair_attempt": attempt.repair.seeded_tokens}
    assert attempt.repair.seeded_tokens > 0


def test_attempts_at_one_task_share_its_group(codeact: CodeAct, agentspec_server: Any) -> None:
    task = codeact.task("oh-task-attempts")
    first, _ = codeact.run(task, steps=2)
    second, _ = codeact.run(task, steps=2)
    assert first.conversation_id != second.conversation_id
    for attempt in (first, second):
        stats = wait_stats(
            agentspec_server.url,
            str(attempt.conversation_id),
            lambda s: s["calls"] >= 2,
        )
        assert stats["group_id"] == "oh-task-attempts"
