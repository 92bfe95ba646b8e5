"""Session statistics of an OpenHands conversation: agentspec's one stats request and error
mapping (agentspec.client.protocol), with the LLM's own address, key and routing header."""

from __future__ import annotations

import socket

import httpx
import pytest

from agentspec.client import BackendUnavailableError, SessionNotFoundError, protocol
from agentspec.testing.stub import StubServer
from openhands_agentspec import agentspec_llm, conversation_stats


def test_stats_of_a_conversation_the_server_does_not_hold_name_it_and_the_server(stub: StubServer) -> None:
    llm = agentspec_llm(stub.url + "/v1", "tiny", group_id="task-1")
    with pytest.raises(SessionNotFoundError) as info:
        conversation_stats(llm, "conv-none")
    assert info.value.session_id == "conv-none" and info.value.backend == stub.url
    assert "'conv-none'" in str(info.value)


def test_stats_read_what_the_conversation_sent(stub: StubServer) -> None:
    body = protocol.with_session({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, "conv-2", "t")
    httpx.post(stub.url + "/v1/chat/completions", json=body, timeout=10).raise_for_status()
    stats = conversation_stats(agentspec_llm(stub.url, "tiny", group_id="t"), "conv-2")
    assert (stats.session_id, stats.group_id, stats.calls, stats.backend) == ("conv-2", "t", 1, stub.url)


def test_an_unreachable_server_is_backend_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(BackendUnavailableError) as info:
        conversation_stats(agentspec_llm(url, "tiny"), "conv-3", timeout_s=5)
    assert info.value.backend == url
