"""ChatAgentSpec's session API (seeds, statistics) on agentspec's protocol layer, against
agentspec's stub server: the statistics request and its errors are the client's own."""

from __future__ import annotations

import socket

import pytest
from pydantic import SecretStr

from agentspec import wire
from agentspec.client import BackendUnavailableError, SessionNotFoundError
from agentspec.testing.stub import StubServer
from langchain_agentspec import AgentSpecSession, ChatAgentSpec
from langchain_agentspec import chat_models as chat_models_module
from langchain_agentspec._stats import NO_KEY, stats_headers


def test_stats_of_a_session_the_server_does_not_hold_name_it_and_the_backend(stub: StubServer) -> None:
    model = ChatAgentSpec(model="tiny", base_url=stub.url, max_retries=0)
    with pytest.raises(SessionNotFoundError) as info:
        model.get_session_stats("s-never")
    assert (info.value.session_id, info.value.backend) == ("s-never", stub.url)
    assert "'s-never'" in str(info.value) and stub.url in str(info.value)


async def test_an_unreachable_backend_is_backend_unavailable_in_both_twins() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    model = ChatAgentSpec(model="tiny", base_url=url, max_retries=0, stats_timeout_s=5)
    with pytest.raises(BackendUnavailableError) as info:
        model.get_session_stats("s1")
    assert info.value.backend == url
    with pytest.raises(BackendUnavailableError):
        await model.aget_session_stats("s1")


def test_stats_carry_the_models_headers_and_key_but_not_the_placeholder() -> None:
    headers = stats_headers({"X-Team": "a"}, SecretStr("sk-1"))
    assert headers == {"X-Team": "a", "Authorization": "Bearer sk-1"}
    assert stats_headers(None, SecretStr(NO_KEY)) == {}
    assert stats_headers(None, lambda: "token") == {}  # a token provider is the OpenAI client's


def test_a_session_handle_binds_its_ids_for_the_wire(stub: StubServer) -> None:
    model = ChatAgentSpec(model="tiny", base_url=stub.url, max_retries=0)
    session = model.session("s-handle", group_id="g-handle")
    assert isinstance(session, AgentSpecSession) and chat_models_module.AgentSpecSession is AgentSpecSession
    session.repair("broken", feedback="the test said no")
    session.runnable.invoke("hi")
    request = stub.generation_requests()[-1]
    assert request.body[wire.XARGS_FIELD] == {wire.XARG_SESSION: "s-handle", wire.XARG_GROUP: "g-handle"}
    assert request.headers[wire.GROUP_HEADER.lower()] == "g-handle"
    assert [seed["kind"] for seed in request.body[wire.SEEDS_FIELD]] == ["repair_attempt", "document"]
    stats = session.stats()
    assert (stats.calls, stats.group_id, stats.backend) == (1, "g-handle", stub.url)
