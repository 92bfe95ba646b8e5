"""ChatAgentSpec against a real ``agentspec serve``: effects the server must show.

Tool calls and structured output use the trick of a random-weight test model: the server's
bounded structured outputs (a regex that spells a whole hermes tool call) make the model
emit the call a trained model would choose; the server's hermes parser then turns it into
a real ``tool_calls`` entry, and everything after that is LangChain's ordinary path.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.output_parsers.openai_tools import PydanticToolsParser
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel, Field

from agentspec.client import SessionNotFoundError, SessionStats
from agentspec.testing.stub import StubServer
from langchain_agentspec import ChatAgentSpec

# agentspec_url gets the server by name.
pytestmark = pytest.mark.server("agentspec_server")

MAX_TOKENS = 24
# A forced hermes call is ~40 tokens of the tiny model's tokenizer: room to finish it.
CALL_TOKENS = 96


class Weather(BaseModel):
    """Look up the weather of a city."""

    city: str = Field(description="lower-case city name")


def _hermes_call(name: str) -> str:
    """A regex spelling one hermes tool call with a short, bounded ``city`` slot."""
    return (
        r"<tool_call>\n\{\"name\": \"" + name + r"\", \"arguments\": "
        r"\{\"city\": \"[a-z]{1,4}\"\}\}\n</tool_call>"
    )


FORCE_WEATHER_CALL: dict[str, Any] = {"structured_outputs": {"regex": _hermes_call("Weather")}}


#: The server publishes a session's statistics a moment after each step.
STATS_WAIT_S = 10.0


def _published(read: Callable[[], SessionStats], calls: int) -> SessionStats:
    """The statistics once they count ``calls`` calls (or the last read after the wait)."""
    deadline = time.monotonic() + STATS_WAIT_S
    while (stats := read()).calls < calls and time.monotonic() < deadline:
        time.sleep(0.2)
    return stats


def _uid(prefix: str) -> str:
    # The server may outlive one test run (AGENTSPEC_TEST_BASE_URL): never reuse a session.
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def llm(agentspec_url: str) -> ChatAgentSpec:
    return ChatAgentSpec(model="tiny", base_url=agentspec_url, temperature=0, max_tokens=MAX_TOKENS, max_retries=0)


# -- tool calling and structured output --------------------------------------------------


def test_tool_call_is_parsed(llm: ChatAgentSpec) -> None:
    reply = llm.bind_tools([Weather]).invoke("weather?", extra_body=FORCE_WEATHER_CALL, max_tokens=CALL_TOKENS)
    assert isinstance(reply, AIMessage)
    assert len(reply.tool_calls) == 1
    call = reply.tool_calls[0]
    assert call["name"] == "Weather"
    assert isinstance(call["args"]["city"], str) and call["args"]["city"]
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] > 0


async def test_tool_call_streamed_async(llm: ChatAgentSpec) -> None:
    bound = llm.bind_tools([Weather])
    full: BaseMessage | None = None
    async for chunk in bound.astream("weather?", extra_body=FORCE_WEATHER_CALL, max_tokens=CALL_TOKENS):
        assert isinstance(chunk, AIMessageChunk)
        full = chunk if full is None else full + chunk  # type: ignore[operator]
    assert isinstance(full, AIMessageChunk)
    assert [c["name"] for c in full.tool_calls] == ["Weather"]
    assert full.usage_metadata is not None  # stream_usage=True


def test_structured_output_through_tools(llm: ChatAgentSpec) -> None:
    """``with_structured_output(method="function_calling")`` minus the forced tool choice.

    vLLM turns a named tool_choice into schema-constrained JSON, which a random model never
    finishes; with tool_choice="auto" the grammar-forced call parses into the schema.
    """
    chain = llm.bind_tools([Weather], tool_choice="auto") | PydanticToolsParser(tools=[Weather], first_tool_only=True)
    result = chain.invoke("weather?", extra_body=FORCE_WEATHER_CALL, max_tokens=CALL_TOKENS)
    assert isinstance(result, Weather)
    assert result.city


# -- extra_body merge and seeds, observed on the server ----------------------------------


def test_per_call_extra_body_keeps_the_models(agentspec_url: str) -> None:
    """The model's ``structured_outputs`` survives a call that adds its own extra_body."""
    llm = ChatAgentSpec(
        model="tiny",
        base_url=agentspec_url,
        temperature=0,
        max_tokens=8,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    reply = llm.invoke("ok?", extra_body={"top_k": 1})
    assert reply.content in ("yes", "no")


def test_seeds_reach_the_sessions_draft_index(llm: ChatAgentSpec) -> None:
    session = llm.session(_uid("seeded"))
    session.runnable.invoke("first turn")
    before = _published(session.stats, calls=1)
    assert before.calls == 1
    session.seed("def handler(event, context):\n    return {'status': 200}\n", kind="document")
    session.repair("return {'status': 500}", feedback="expected 200")
    assert len(session.pending_seeds) == 3
    session.runnable.invoke("second turn")
    after = _published(session.stats, calls=2)
    assert after.calls == 2
    assert after.seeded_tokens > before.seeded_tokens
    assert session.pending_seeds == []


async def test_async_session_stats(llm: ChatAgentSpec) -> None:
    sid = _uid("async")
    with pytest.raises(SessionNotFoundError):
        await llm.aget_session_stats(sid)
    await llm.ainvoke("hello", session_id=sid)
    chunks = [c async for c in llm.astream("again", session_id=sid)]
    assert chunks
    deadline = time.monotonic() + STATS_WAIT_S
    while (stats := await llm.aget_session_stats(sid)).calls < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert stats.calls == 2


# -- a LangGraph agent with a checkpointer -----------------------------------------------


@tool
def get_weather(city: str) -> str:
    """Look up the weather of a city."""
    return f"sunny in {city}"


def _agent(llm: ChatAgentSpec) -> Any:
    """A tool-calling agent: it calls ``get_weather`` once per user turn, then answers.

    Which step forces a call is decided from the messages (a stand-in for a trained
    model's choice); every model call goes through the same ChatAgentSpec.
    """
    with_tools = llm.bind_tools([get_weather])

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        messages = state["messages"]
        if isinstance(messages[-1], HumanMessage):
            extra = {"structured_outputs": {"regex": _hermes_call("get_weather")}}
            return {"messages": [with_tools.invoke(messages, extra_body=extra, max_tokens=CALL_TOKENS)]}
        return {"messages": [with_tools.invoke(messages)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    graph.add_edge("agent", END)
    return graph.compile(checkpointer=InMemorySaver())


def _run_turns(app: Any, thread_id: str, turns: int) -> list[BaseMessage]:
    config = {"configurable": {"thread_id": thread_id}}
    state: dict[str, Any] = {}
    for i in range(turns):
        state = app.invoke({"messages": [HumanMessage(f"turn {i}: weather?")]}, config)
    return state["messages"]


def test_langgraph_thread_is_one_session(llm: ChatAgentSpec) -> None:
    app = _agent(llm)
    thread_a, thread_b = _uid("thread-a"), _uid("thread-b")
    messages_a = _run_turns(app, thread_a, 3)
    _run_turns(app, thread_b, 2)

    # The checkpointer kept the history: 3 turns of human, call, tool result, answer.
    assert len(messages_a) == 12
    assert sum(1 for m in messages_a if isinstance(m, AIMessage) and m.tool_calls) == 3
    # Two model calls per turn, all in the thread's own session; threads stay apart.
    stats_a = _published(lambda: llm.get_session_stats(thread_a), calls=6)
    stats_b = _published(lambda: llm.get_session_stats(thread_b), calls=4)
    assert (stats_a.calls, stats_b.calls) == (6, 4)
    # The group defaults to the session (the server may report it as None then).
    assert stats_a.group_id in (None, thread_a) and stats_b.group_id in (None, thread_b)
    assert stats_a.indexed_tokens > 0


def test_langgraph_threads_pin_to_one_backend_each(agentspec_url: str) -> None:
    """With two backends every call of a thread reaches the same one, and only that one."""
    stub = StubServer(name="second", model="tiny")
    stub.start()
    try:
        llm = ChatAgentSpec(
            model="tiny",
            backends=[agentspec_url, stub.url],
            temperature=0,
            max_tokens=MAX_TOKENS,
            max_retries=0,
        )
        app = _agent(llm)
        threads = [_uid(f"pinned-{i}") for i in range(4)]
        # Model calls per thread = AI messages in its checkpointed history (the stub answers
        # in text, never with a tool call, so threads there make fewer calls).
        model_calls = {thread: sum(isinstance(m, AIMessage) for m in _run_turns(app, thread, 2)) for thread in threads}
        homes = {thread: llm.backend_for(thread) for thread in threads}
        # Bounded load over two backends: four threads cannot all land on one.
        assert set(homes.values()) == {agentspec_url, stub.url}
        for thread, home in homes.items():
            stats = _published(lambda thread=thread: llm.get_session_stats(thread), calls=model_calls[thread])
            assert stats.calls == model_calls[thread]
            on_stub = sum(1 for r in stub.generation_requests() if r.session_id == thread)
            assert on_stub == (model_calls[thread] if home == stub.url else 0)
    finally:
        stub.stop()
