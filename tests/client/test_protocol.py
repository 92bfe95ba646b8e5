"""The protocol layer for integrations (agentspec.client.protocol): what a request carries,
the session-stats request, and the one mapping of HTTP answers to the client's errors.

Requests built here go to the stub server, which checks ids and seeds as ``agentspec
serve`` does; the error mapping is also checked on answers no stub gives (401, 5xx).
"""

from __future__ import annotations

import ast
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentspec import wire
from agentspec.client import (
    AgentSpecClientError,
    AuthenticationError,
    BackendUnavailableError,
    Seed,
    ServerRefusedError,
    SessionNotFoundError,
    SessionStats,
    protocol,
)
from agentspec.testing.stats import session_stats
from agentspec.testing.stub import StubServer

BACKEND = "http://127.0.0.1:9"
CHAT = [{"role": "user", "content": "hi"}]


def _response(status: int, **kwargs: Any) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("GET", BACKEND + "/x"), **kwargs)


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- what a request carries ---------------------------------------------------------------


def test_ids_go_last_and_the_group_defaults_to_the_session() -> None:
    base = {wire.SESSION_HEADER: "caller's", "Authorization": "Bearer k"}
    headers = protocol.session_headers("s1", None, base)
    assert headers == {wire.SESSION_HEADER: "s1", wire.GROUP_HEADER: "s1", "Authorization": "Bearer k"}
    assert protocol.session_headers(None, "g1") == {wire.GROUP_HEADER: "g1"}
    assert protocol.session_headers(None, None, {"a": "b"}) == {"a": "b"}
    assert protocol.session_xargs("s1", "g1", {"top_k_extra": 1}) == {
        "top_k_extra": 1,
        wire.XARG_SESSION: "s1",
        wire.XARG_GROUP: "g1",
    }


def test_with_session_merges_xargs_and_appends_seeds_without_touching_the_input() -> None:
    body = {"messages": CHAT, wire.XARGS_FIELD: {"x": 1}, wire.SEEDS_FIELD: [{"text": "first"}]}
    out = protocol.with_session(body, "s1", None, [Seed.of("second", "document")])
    assert out[wire.XARGS_FIELD] == {"x": 1, wire.XARG_SESSION: "s1", wire.XARG_GROUP: "s1"}
    assert out[wire.SEEDS_FIELD] == [
        {"text": "first"},
        {"text": "second", "kind": "document", "scope": "session"},
    ]
    assert body[wire.XARGS_FIELD] == {"x": 1} and len(body[wire.SEEDS_FIELD]) == 1
    # No ids: the body keeps its xargs as they were.
    assert protocol.with_session({"messages": CHAT}, None) == {"messages": CHAT}


def test_a_request_built_by_the_protocol_is_one_the_server_takes(stubs: tuple[StubServer, StubServer]) -> None:
    stub = stubs[0]
    body = protocol.with_session({"model": "stub-model", "messages": CHAT}, "s-proto", "g-proto", [Seed.of("abc")])
    headers = protocol.session_headers("s-proto", "g-proto")
    httpx.post(stub.url + "/v1/chat/completions", json=body, headers=headers, timeout=10).raise_for_status()
    seeds = protocol.seeds_request_body("s-proto", [Seed.of("defg", "sibling_output", "group")], group_id="g-proto")
    answer = httpx.post(stub.url + wire.SEEDS_PATH, json=seeds, timeout=10).raise_for_status().json()
    assert answer["seeded_tokens"] == 4
    with httpx.Client(timeout=10) as http:
        stats = protocol.fetch_session_stats(http, stub.url, "s-proto", headers=headers)
    assert (stats.session_id, stats.group_id, stats.calls, stats.backend) == ("s-proto", "g-proto", 1, stub.url)
    assert stats.seeded_tokens == 3 + 4


# -- the session-stats request --------------------------------------------------------------


def test_the_stats_request_quotes_the_id_and_carries_the_cache_salt() -> None:
    request = protocol.session_stats_request(BACKEND + "/", "a/b:c", headers={"k": "v"}, cache_salt="salt")
    assert request.url == BACKEND + wire.SESSION_STATS_PATH + "a%2Fb%3Ac"
    assert request.params == {wire.CACHE_SALT_FIELD: "salt"}
    assert request.headers == {"k": "v"}
    assert protocol.session_stats_request(BACKEND, "s").params == {}


def test_stats_of_a_session_the_server_does_not_hold_name_it_and_the_backend(
    stubs: tuple[StubServer, StubServer],
) -> None:
    stub = stubs[0]
    with httpx.Client(timeout=10) as http, pytest.raises(SessionNotFoundError) as info:
        protocol.fetch_session_stats(http, stub.url, "s-nowhere")
    err = info.value
    assert (err.status_code, err.session_id, err.backend) == (404, "s-nowhere", stub.url)
    assert "'s-nowhere'" in str(err) and stub.url in str(err)
    assert err.message == "no state for session 's-nowhere'"


async def test_async_twin_reads_the_same_stats(stubs: tuple[StubServer, StubServer]) -> None:
    stub = stubs[1]
    body = protocol.with_session({"model": "stub-model", "messages": CHAT}, "s-async", None)
    async with httpx.AsyncClient(timeout=10) as http:
        (await http.post(stub.url + "/v1/chat/completions", json=body)).raise_for_status()
        stats = await protocol.afetch_session_stats(http, stub.url, "s-async")
        assert isinstance(stats, SessionStats) and stats.calls == 1 and stats.group_id == "s-async"
        with pytest.raises(SessionNotFoundError):
            await protocol.afetch_session_stats(http, stub.url, "s-async-unknown")


def test_an_invalid_id_is_the_servers_wire_error_naming_the_field(stubs: tuple[StubServer, StubServer]) -> None:
    with httpx.Client(timeout=10) as http, pytest.raises(ServerRefusedError) as info:
        protocol.fetch_session_stats(http, stubs[0].url, "not an id!")
    err = info.value
    assert type(err) is ServerRefusedError and err.status_code == 400
    assert err.param == "path session id" and wire.ID_RULE in err.message


async def test_an_unreachable_backend_is_backend_unavailable_in_both_twins() -> None:
    url = _closed_port_url()
    with httpx.Client(timeout=5) as http, pytest.raises(BackendUnavailableError) as info:
        protocol.fetch_session_stats(http, url, "s1")
    assert info.value.backend == url and "'s1'" in str(info.value)
    assert isinstance(info.value.__cause__, httpx.TransportError)
    async with httpx.AsyncClient(timeout=5) as http:
        with pytest.raises(BackendUnavailableError):
            await protocol.afetch_session_stats(http, url, "s1")


def test_a_stats_answer_that_is_not_an_object_is_a_backend_failure() -> None:
    with pytest.raises(BackendUnavailableError, match="malformed statistics of session 's1'"):
        protocol.read_session_stats(_response(200, json=[1, 2]), BACKEND, "s1")
    with pytest.raises(BackendUnavailableError, match="malformed JSON"):
        protocol.read_session_stats(_response(200, text="{"), BACKEND, "s1")


def test_the_test_suites_stats_reader_uses_the_same_request_and_errors(stubs: tuple[StubServer, StubServer]) -> None:
    stub = stubs[0]
    assert session_stats(stub.url, "s-test-none", wait=False) is None
    body = protocol.with_session({"model": "stub-model", "messages": CHAT}, "s-test", None)
    httpx.post(stub.url + "/v1/chat/completions", json=body, timeout=10).raise_for_status()
    stats = session_stats(stub.url, "s-test", until=lambda s: s["calls"] >= 1)
    assert stats is not None and stats["calls"] == 1 and "backend" not in stats  # the server's own answer
    with pytest.raises(ServerRefusedError) as info:
        session_stats(stub.url, "not an id!", wait=False)
    assert info.value.status_code == 400


# -- one error mapping ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "session_id", "expected"),
    [
        (401, None, AuthenticationError),
        (403, "s1", AuthenticationError),
        (404, "s1", SessionNotFoundError),
        (404, None, ServerRefusedError),  # not a request about a session: a plain refusal
        (400, "s1", ServerRefusedError),
        (429, None, ServerRefusedError),
        (500, "s1", BackendUnavailableError),
        (503, None, BackendUnavailableError),
    ],
)
def test_one_mapping_of_status_to_error(status: int, session_id: str | None, expected: type[Exception]) -> None:
    body = wire.error_body("why", "SomeError", status, "agentspec_seeds[0]")
    with pytest.raises(expected) as info:
        protocol.check_response(_response(status, json=body), BACKEND, session_id=session_id)
    err = info.value
    assert type(err) is expected and isinstance(err, AgentSpecClientError)
    assert BACKEND in str(err)
    if isinstance(err, ServerRefusedError):
        assert (err.status_code, err.message, err.param, err.body) == (status, "why", "agentspec_seeds[0]", body)


def test_a_refused_key_says_what_to_do() -> None:
    with pytest.raises(AuthenticationError, match=r"refused the API key \(401\).*--api-key"):
        protocol.check_response(_response(401, json={"error": "Unauthorized"}), BACKEND)


def test_success_passes_and_plain_text_errors_keep_their_text() -> None:
    protocol.check_response(_response(204), BACKEND)
    with pytest.raises(ServerRefusedError) as info:
        protocol.check_response(_response(418, text="short and stout"), BACKEND)
    assert info.value.message == "short and stout" and info.value.param is None


# -- the names on the wire are agentspec.wire's ------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
#: Sources that speak the wire: the client and the framework integrations (not their tests,
#: which write the wire format out on purpose to check it).
WIRE_SPEAKERS = [REPO / "agentspec" / "client"] + sorted(
    path.parent for path in (REPO / "integrations").glob("*/*/__init__.py") if "tests" not in path.parts
)
#: Literals equal to a wire name that are not one: Python parameter names, which happen to
#: be spelled as the wire's keys (InvalidIdError and LangChain's call arguments name them).
NOT_WIRE_NAMES = {
    ("agentspec/client/_core.py", "session_id"),
    ("agentspec/client/_core.py", "group_id"),
    ("integrations/langchain/langchain_agentspec/_ids.py", "session_id"),
    ("integrations/langchain/langchain_agentspec/_ids.py", "group_id"),
}


def _wire_names() -> set[str]:
    """The keys of ``vllm_xargs``, the body fields and the headers agentspec.wire names."""
    names = {value for name, value in vars(wire).items() if name.startswith("XARG_") and isinstance(value, str)}
    names |= {wire.XARGS_FIELD, wire.SEEDS_FIELD, wire.BODY_SESSION_FIELD, wire.PROMPT_CACHE_KEY_FIELD}
    names |= {wire.CACHE_SALT_FIELD, wire.SESSION_HEADER, wire.GROUP_HEADER}
    names |= {wire.LITELLM_SESSION_HEADER, wire.SMG_ROUTING_HEADER}
    return {name.lower() for name in names}


def _literals(path: Path) -> Iterator[tuple[int, str]]:
    """The string literals of a module, docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_clients_and_integrations_take_wire_names_from_agentspec_wire() -> None:
    assert len(WIRE_SPEAKERS) >= 4  # the client, LangChain, OpenHands, RL
    names = _wire_names()
    found = []
    for root in WIRE_SPEAKERS:
        for path in sorted(root.rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            found += [
                f"{where}:{line}: {value!r}"
                for line, value in _literals(path)
                if value.lower() in names and (where, value) not in NOT_WIRE_NAMES
            ]
    assert not found, "use agentspec.wire's constants (or agentspec.client.protocol) for:\n" + "\n".join(found)
