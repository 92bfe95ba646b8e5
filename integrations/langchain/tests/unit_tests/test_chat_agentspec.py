"""ChatAgentSpec's own behaviour, observed on the wire of agentspec's stub server.

The stub is a real HTTP server that checks ids and seeds as ``agentspec serve`` does and
records every request, so these tests see exactly what a server would receive.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableLambda

from agentspec.client import SessionNotFoundError
from agentspec.testing.stub import RecordedRequest, StubServer
from langchain_agentspec import ChatAgentSpec
from langchain_agentspec.chat_models import merge_extra_body


def _model(stub: StubServer, **kwargs: Any) -> ChatAgentSpec:
    params: dict[str, Any] = {"model": "tiny", "base_url": stub.url, "max_retries": 0}
    params.update(kwargs)
    return ChatAgentSpec(**params)


def _last(stub: StubServer) -> RecordedRequest:
    return stub.generation_requests()[-1]


def _ids(request: RecordedRequest) -> tuple[str | None, str | None, dict[str, Any] | None]:
    return (
        request.headers.get("x-session-id"),
        request.headers.get("x-group-id"),
        request.body.get("vllm_xargs"),
    )


# -- construction ------------------------------------------------------------------------


def test_base_url_gets_v1_and_key_defaults_without_openai_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-secret")
    monkeypatch.delenv("AGENTSPEC_API_KEY", raising=False)
    model = ChatAgentSpec(model="tiny", base_url="http://127.0.0.1:9/")
    assert model.openai_api_base == "http://127.0.0.1:9/v1"
    # The user's OpenAI key must not travel to a vLLM server.
    assert model.openai_api_key is not None
    assert model.openai_api_key.get_secret_value() == "EMPTY"
    assert model.use_responses_api is False
    assert model.stream_usage is True


def test_identity() -> None:
    model = ChatAgentSpec(model="tiny", base_url="http://127.0.0.1:9")
    assert model._llm_type == "agentspec-chat"
    params = model._get_ls_params(max_tokens=7)
    assert params["ls_provider"] == "agentspec"
    assert params["ls_model_name"] == "tiny"


def test_invalid_ids_are_refused_early() -> None:
    with pytest.raises(ValueError, match="session_id"):
        ChatAgentSpec(model="tiny", base_url="http://127.0.0.1:9", session_id="has space")
    model = ChatAgentSpec(model="tiny", base_url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="group_id"):
        model.invoke("hi", session_id="ok", group_id="x" * 129)


def test_base_url_and_other_backends_conflict() -> None:
    with pytest.raises(ValueError, match="either base_url or backends"):
        ChatAgentSpec(model="tiny", base_url="http://h:1", backends=["http://h:2"])


# -- ids on the wire ---------------------------------------------------------------------


def test_no_session_sends_no_ids(stub: StubServer) -> None:
    _model(stub).invoke("hello")
    assert _ids(_last(stub)) == (None, None, None)


def test_model_session_on_headers_and_xargs(stub: StubServer) -> None:
    _model(stub, session_id="s-model", group_id="g-model").invoke("hello")
    assert _ids(_last(stub)) == (
        "s-model",
        "g-model",
        {"session_id": "s-model", "group_id": "g-model"},
    )


def test_group_defaults_to_session(stub: StubServer) -> None:
    _model(stub).invoke("hello", session_id="solo")
    assert _ids(_last(stub)) == ("solo", "solo", {"session_id": "solo", "group_id": "solo"})


def test_resolution_order(stub: StubServer) -> None:
    """Call argument > model field > metadata agentspec_session_id > LangGraph thread_id."""
    all_sources = {
        "metadata": {"agentspec_session_id": "from-meta", "agentspec_group_id": "g-meta"},
        "configurable": {"thread_id": "from-thread"},
    }
    with_model = _model(stub, session_id="from-model")
    without = _model(stub)

    with_model.invoke("x", config=all_sources, session_id="from-call", group_id="g-call")  # type: ignore[arg-type]
    assert _ids(_last(stub))[:2] == ("from-call", "g-call")

    with_model.invoke("x", config=all_sources)  # type: ignore[arg-type]
    assert _ids(_last(stub))[:2] == ("from-model", "g-meta")

    without.invoke("x", config=all_sources)  # type: ignore[arg-type]
    assert _ids(_last(stub))[:2] == ("from-meta", "g-meta")

    without.invoke("x", config={"configurable": {"thread_id": "from-thread"}})
    assert _ids(_last(stub))[:2] == ("from-thread", "from-thread")

    # configurable.agentspec_session_id is copied into metadata by LangChain as well.
    without.invoke("x", config={"configurable": {"agentspec_session_id": "cfg", "thread_id": "t"}})
    assert _ids(_last(stub))[:2] == ("cfg", "cfg")


def test_bind_carries_session(stub: StubServer) -> None:
    _model(stub).bind(session_id="bound").invoke("x")
    assert _ids(_last(stub))[0] == "bound"


def test_thread_id_inside_a_parent_runnable(stub: StubServer) -> None:
    """The model is called inside a chain (as in a LangGraph node): the thread still counts."""
    model = _model(stub)
    chain = RunnableLambda(lambda text: model.invoke(text))
    chain.invoke("x", config={"configurable": {"thread_id": "outer-thread"}})
    assert _ids(_last(stub))[0] == "outer-thread"


def test_thread_id_that_breaks_the_wire_rule_is_hashed(stub: StubServer) -> None:
    model = _model(stub)
    model.invoke("x", config={"configurable": {"thread_id": "user 7 / ünïcode"}})
    first = _ids(_last(stub))[0]
    model.invoke("y", config={"configurable": {"thread_id": "user 7 / ünïcode"}})
    assert first is not None and first.startswith("lg-")
    assert _ids(_last(stub))[0] == first  # stable: the thread stays one session


def test_explicit_metadata_id_must_be_valid(stub: StubServer) -> None:
    with pytest.raises(ValueError, match="agentspec_session_id"):
        _model(stub).invoke("x", config={"metadata": {"agentspec_session_id": "bad id"}})


# -- extra_body --------------------------------------------------------------------------


def test_merge_extra_body_is_deep_and_copies() -> None:
    base = {"top_k": 5, "vllm_xargs": {"a": 1}, "keep": [1]}
    merged = merge_extra_body(base, {"vllm_xargs": {"b": 2}, "top_k": 7})
    assert merged == {"top_k": 7, "vllm_xargs": {"a": 1, "b": 2}, "keep": [1]}
    merged["vllm_xargs"]["c"] = 3
    assert base["vllm_xargs"] == {"a": 1}


def test_per_call_extra_body_merges_with_the_models(stub: StubServer) -> None:
    model = _model(stub, extra_body={"top_k": 5, "vllm_xargs": {"tenant": "t1"}})
    model.invoke("x", session_id="s", extra_body={"min_p": 0.1, "vllm_xargs": {"trace": "x"}})
    body = _last(stub).body
    assert body["top_k"] == 5 and body["min_p"] == 0.1
    assert body["vllm_xargs"] == {"tenant": "t1", "trace": "x", "session_id": "s", "group_id": "s"}
    # The model's own extra_body is left untouched for the next call.
    assert model.extra_body == {"top_k": 5, "vllm_xargs": {"tenant": "t1"}}
    model.invoke("y")
    assert _last(stub).body["top_k"] == 5 and "min_p" not in _last(stub).body


def test_ids_win_over_caller_xargs_and_headers(stub: StubServer) -> None:
    model = _model(stub)
    model.invoke(
        "x",
        session_id="real",
        extra_body={"vllm_xargs": {"session_id": "spoof"}},
        extra_headers={"X-Session-Id": "spoof", "X-Trace": "t"},
    )
    request = _last(stub)
    assert _ids(request)[0] == "real"
    assert request.body["vllm_xargs"]["session_id"] == "real"
    assert request.headers["x-trace"] == "t"


# -- seeds -------------------------------------------------------------------------------


def test_seeds_travel_with_the_sessions_next_call_only(stub: StubServer) -> None:
    model = _model(stub)
    session = model.session("s-seed")
    session.seed("def f(x):\n    return x\n")
    session.repair("bad attempt", feedback="AssertionError: 1 != 2")
    assert [s["kind"] for s in session.pending_seeds] == [
        "prior_turn",
        "repair_attempt",
        "document",
    ]

    model.invoke("other session", session_id="someone-else")
    assert "agentspec_seeds" not in _last(stub).body

    session.runnable.invoke("fix it")
    seeds = _last(stub).body["agentspec_seeds"]
    assert seeds == [
        {"kind": "prior_turn", "scope": "session", "text": "def f(x):\n    return x\n"},
        {"kind": "repair_attempt", "scope": "session", "text": "bad attempt"},
        {"kind": "document", "scope": "session", "text": "AssertionError: 1 != 2"},
    ]
    assert stub.sessions["s-seed"].seeded_tokens > 0
    assert session.pending_seeds == []
    model.invoke("again", session_id="s-seed")
    assert "agentspec_seeds" not in _last(stub).body


def test_seed_token_ids_and_group_scope(stub: StubServer) -> None:
    model = _model(stub, session_id="s-tok")
    model.add_seed([1, 2, 3], scope="group", kind="sibling_output")
    model.invoke("x")
    assert _last(stub).body["agentspec_seeds"] == [{"kind": "sibling_output", "scope": "group", "token_ids": [1, 2, 3]}]


def test_seed_validation_and_limits(stub: StubServer) -> None:
    model = _model(stub, max_seeds_per_request=2)
    with pytest.raises(ValueError, match="no session"):
        model.add_seed("text")
    with pytest.raises(ValueError):
        model.add_seed("", session_id="s")
    with pytest.raises(ValueError):
        model.add_seed("x", kind="nonsense", session_id="s")  # type: ignore[arg-type]
    model.add_seed("a", session_id="s")
    model.add_seed("b", session_id="s")
    with pytest.raises(ValueError, match="at most 2"):
        model.add_seed("c", session_id="s")
    assert model.discard_seeds("s") == 2


def test_seeds_found_from_the_enclosing_run(stub: StubServer) -> None:
    """A tool or node calling ``llm.repair(...)`` inside a LangGraph thread needs no id."""
    model = _model(stub)

    def node(text: str) -> AIMessage:
        model.repair("broken patch")
        return model.invoke(text)  # type: ignore[return-value]

    RunnableLambda(node).invoke("x", config={"configurable": {"thread_id": "t-repair"}})
    request = _last(stub)
    assert _ids(request)[0] == "t-repair"
    assert request.body["agentspec_seeds"][0]["text"] == "broken patch"


def test_seeds_of_a_refused_call_stay_pending(stub: StubServer) -> None:
    model = _model(stub)
    model.add_seed("keep me", session_id="s-fail")
    stub.fail_next(1, status=400)
    with pytest.raises(Exception):  # noqa: B017 - langchain-openai's BadRequestError
        model.invoke("x", session_id="s-fail")
    assert [s["text"] for s in model.pending_seeds("s-fail")] == ["keep me"]
    model.invoke("x", session_id="s-fail")
    assert _last(stub).body["agentspec_seeds"][0]["text"] == "keep me"


def test_seeds_are_per_model_instance(stub: StubServer) -> None:
    one, two = _model(stub), _model(stub)
    one.add_seed("only for one", session_id="shared")
    two.invoke("x", session_id="shared")
    assert "agentspec_seeds" not in _last(stub).body


# -- stats -------------------------------------------------------------------------------


def test_session_stats(stub: StubServer) -> None:
    model = _model(stub)
    session = model.session("s-stats")
    with pytest.raises(SessionNotFoundError):
        session.stats()
    session.runnable.invoke("one")
    session.runnable.invoke("two")
    assert session.stats().calls == 2
    assert stub.requests[-1].headers["x-session-id"] == "s-stats"


@pytest.mark.asyncio
async def test_session_stats_async(stub: StubServer) -> None:
    model = _model(stub)
    await model.ainvoke("one", session_id="s-astats")
    stats = await model.aget_session_stats("s-astats")
    assert stats.calls == 1


# -- async and streaming carry the same ids ----------------------------------------------


@pytest.mark.asyncio
async def test_async_and_streaming_paths(stub: StubServer) -> None:
    model = _model(stub, session_id="s-paths")
    model.add_seed("seed-1")
    chunks = [c async for c in model.astream([HumanMessage("hello there")])]
    assert "".join(str(c.content) for c in chunks) == "echo: hello there"
    request = _last(stub)
    assert request.body["stream"] is True
    assert _ids(request)[0] == "s-paths"
    assert request.body["agentspec_seeds"][0]["text"] == "seed-1"
    # Usage arrives on the stream (stream_usage=True).
    assert any(c.usage_metadata for c in chunks)

    text = "".join(str(c.content) for c in model.stream("sync stream"))
    assert text == "echo: sync stream"
    assert _ids(_last(stub))[0] == "s-paths"
    await model.ainvoke("x", session_id="s-other")
    assert _ids(_last(stub))[0] == "s-other"
