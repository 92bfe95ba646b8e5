"""Real OpenHands CodeAct conversations for the tests, and how to read the servers' view.

The tiny test model is random, so its next token means nothing; vLLM's structured outputs
(a regular expression in the request body) make every answer a well-formed hermes tool
call, and temperature 0 makes the run repeatable (on the real model the regex fixes only
the call's format and leaves the command to the model). The agent is OpenHands' own
``Agent`` with its terminal and file-editor tools, run by OpenHands' ``Conversation``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from openhands.sdk import Agent, Conversation, Tool
from openhands.sdk.context.condenser.base import CondenserBase
from openhands.sdk.event import ActionEvent, Event
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.terminal import TerminalTool

from agentspec import wire
from agentspec.testing.stats import session_stats
from openhands_agentspec import AgentspecTask, TaskAttempt

#: Short, so that the tiny model's 2048-token context holds several steps.
SYSTEM_PROMPT = "You are a coding agent. Use the terminal and the file editor."


def tool_call_regex(command: str) -> str:
    """A hermes terminal call whose command matches ``command`` (a regex without quotes)."""
    return r'<tool_call>\n\{"name": "terminal", "arguments": \{"command": "' + command + r'"\}\}\n</tool_call>'


#: Commands that fail (``cat`` of a file that is not there: exit code 1).
FAILING = "cat missing-[a-z]{1,6}"
#: Commands that succeed.
SUCCEEDING = "echo [a-z]{1,8}"


@dataclass
class Run:
    """One conversation run: its events and the calls its LLMs made."""

    conversation: Any
    events: list[Event] = field(default_factory=list)

    @property
    def actions(self) -> list[ActionEvent]:
        return [e for e in self.events if isinstance(e, ActionEvent)]

    def llm_calls(self) -> int:
        """Calls made by every LLM of the conversation (agent and condenser)."""
        metrics = self.conversation.state.stats.usage_to_metrics.values()
        return sum(len(m.response_latencies) for m in metrics)


@dataclass
class CodeAct:
    """Builds and runs real CodeAct conversations against one server or router."""

    base_url: str
    workspace: Path
    #: The served model name: ``tiny``, or the real model's (REAL_MODEL_NAME).
    model: str = "tiny"

    def task(self, task_id: str, command: str = SUCCEEDING, **llm_fields: Any) -> AgentspecTask:
        fields: dict[str, Any] = {
            "max_output_tokens": 96,
            "num_retries": 4,
            "retry_min_wait": 1,
            "retry_max_wait": 2,
        }
        fields.update(llm_fields)
        return AgentspecTask(
            self.base_url,
            self.model,
            task_id,
            temperature=0,
            extra_body={"structured_outputs": {"regex": tool_call_regex(command)}},
            **fields,
        )

    def run(
        self,
        task: AgentspecTask,
        steps: int,
        *,
        condenser: CondenserBase | None = None,
        on_event: Callable[[Event], None] | None = None,
        message: str = "The tests fail. Find out why and fix it.",
    ) -> tuple[TaskAttempt, Run]:
        agent = Agent(
            llm=task.llm(),
            # The subprocess terminal (a shell on a pseudo-terminal): OpenHands' default,
            # a pool of tmux panes, misses its prompt markers on a loaded machine and then
            # reports every command's exit code as unknown after a 30 s wait.
            tools=[
                Tool(name=TerminalTool.name, params={"terminal_type": "subprocess"}),
                Tool(name=FileEditorTool.name),
            ],
            system_prompt=SYSTEM_PROMPT,
            condenser=condenser,
        )
        attempt = task.attempt()
        run = Run(conversation=None)
        callbacks = [*attempt.callbacks, run.events.append]
        if on_event is not None:
            callbacks.append(on_event)
        conversation = Conversation(
            agent=agent,
            workspace=str(self.workspace),
            conversation_id=attempt.conversation_id,
            callbacks=callbacks,
            max_iteration_per_run=steps,
            stuck_detection=False,
            visualizer=None,
        )
        run.conversation = conversation
        conversation.send_message(message)
        # Ends at max_iteration_per_run: under the tool-call regex no answer finishes.
        conversation.run()
        return attempt, run


def wait_stats(
    base_url: str,
    session_id: str,
    done: Callable[[dict[str, Any]], bool],
    timeout: float = 15.0,
) -> dict[str, Any]:
    """The session's stats once ``done`` holds (the engine publishes them shortly after a step)."""
    deadline = time.monotonic() + timeout
    stats: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        stats = session_stats(base_url, session_id, wait=False)
        if stats is not None and done(stats):
            return stats
        time.sleep(0.2)
    raise AssertionError(f"session {session_id!r} on {base_url}: {json.dumps(stats)}")


def backend_of(router_url: str, backends: list[str], routing_key: str) -> str:
    """The backend vllm-router sends ``routing_key`` to: seed a probe session through the
    router, then ask each backend directly which one holds it."""
    probe = f"probe-{uuid.uuid4().hex[:12]}"
    body = {wire.BODY_SESSION_FIELD: probe, wire.SEEDS_FIELD: [{"text": "probe"}]}
    r = httpx.post(
        router_url + wire.SEEDS_PATH,
        json=body,
        headers={wire.SESSION_HEADER: routing_key},
        timeout=30,
    )
    r.raise_for_status()
    holders = [b for b in backends if session_stats(b, probe, wait=False) is not None]
    assert len(holders) == 1, f"probe {probe} held by {holders}"
    return holders[0]
