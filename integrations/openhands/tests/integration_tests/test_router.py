"""Behind vLLM's real router (``vllm-router --policy consistent_hash``) over two
``agentspec serve``: a task's conversations stay on the server its group hashes to, and a
backend killed mid-conversation costs no turn."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from codeact_harness import CodeAct, backend_of, session_stats, wait_stats
from openhands.sdk.event import ActionEvent, Event

from agentspec.testing.router import VLLMRouter, find_router

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        find_router() is None,
        reason="vllm-router is not installed (pip install vllm-router)",
    ),
]


def task_ids_by_backend(router: VLLMRouter, backends: list[str], prefix: str) -> dict[str, str]:
    """One task id per backend: the first ids, in order, that the router hashes there."""
    placed: dict[str, str] = {}
    for i in range(64):
        task_id = f"{prefix}-{i}"
        placed.setdefault(backend_of(router.url, backends, task_id), task_id)
        if len(placed) == len(backends):
            return placed
    raise AssertionError(f"64 task ids all hashed to {list(placed)}")


@pytest.fixture(scope="module")
def router(
    agentspec_server: Any,
    agentspec_peer_server: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[VLLMRouter]:
    backends = [agentspec_server.url, agentspec_peer_server.url]
    with VLLMRouter.start(backends, log_dir=tmp_path_factory.mktemp("router")) as running:
        yield running


def test_tasks_stay_on_the_backend_their_group_hashes_to(router: VLLMRouter, workspace: Path) -> None:
    backends = list(router.workers)
    codeact = CodeAct(router.url, workspace)
    for backend, task_id in task_ids_by_backend(router, backends, "oh-route").items():
        attempts = [codeact.run(codeact.task(task_id), steps=3) for _ in range(2)]
        for attempt, run in attempts:
            sid = str(attempt.conversation_id)
            stats = wait_stats(backend, sid, lambda s: s["calls"] >= 3)
            assert stats["calls"] == run.llm_calls() == 3 and stats["group_id"] == task_id
            assert all(session_stats(other, sid, wait=False) is None for other in backends if other != backend)
            # Statistics through the router reach the same server (the group's routing key).
            assert attempt.stats().calls == 3


def test_killing_a_backend_mid_conversation_loses_no_turn(
    agentspec_server: Any,
    agentspec_spare_server: Any,
    workspace: Path,
    tmp_path: Path,
) -> None:
    doomed = agentspec_spare_server
    try:
        with VLLMRouter.start([agentspec_server.url, doomed.url], log_dir=tmp_path) as router:
            backends = [agentspec_server.url, doomed.url]
            task_id = task_ids_by_backend(router, backends, "oh-failover")[doomed.url]
            killed_at: list[float] = []
            action_times: list[float] = []

            def kill_after_two_turns(event: Event) -> None:
                if isinstance(event, ActionEvent):
                    action_times.append(time.monotonic())
                    if len(action_times) == 2:
                        doomed.kill()
                        killed_at.append(time.monotonic())

            codeact = CodeAct(router.url, workspace)
            attempt, run = codeact.run(codeact.task(task_id), steps=5, on_event=kill_after_two_turns)
    finally:
        doomed.stop()
    # Every turn completed: five answers, five tool calls, no error but the step limit.
    assert killed_at and len(run.actions) == 5 and run.llm_calls() == 5
    sid = str(attempt.conversation_id)
    # The surviving server took the session over and drafts from the prompt it was sent.
    stats = wait_stats(agentspec_server.url, sid, lambda s: s["calls"] >= 3)
    assert stats["calls"] == 3 and stats["group_id"] == task_id
    assert stats["indexed_tokens"] > 0 and stats["draft_steps"] > 0
    print(
        f"\nfailover: turns lost 0 of 5; the turn after the kill answered "
        f"{action_times[2] - killed_at[0]:.2f} s after it (turns before: "
        f"{action_times[1] - action_times[0]:.2f} s apart)"
    )
