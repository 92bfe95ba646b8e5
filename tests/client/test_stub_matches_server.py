"""The stub server and a real ``agentspec serve`` answer the same requests in the same shapes.

Client tests run against the stub (fast, injectable faults); this test keeps the stub
honest: statistics, errors and their ``param`` fields come out alike, because both sides
take the contract from :mod:`agentspec.wire`. Slow (needs the shared real server).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from agentspec import wire
from agentspec.testing.stub import StubServer

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def stub():
    with StubServer(model="tiny") as server:
        yield server


def _chat(url: str, *, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    payload = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    payload.update(body)
    return httpx.post(url + "/v1/chat/completions", json=payload, headers=headers or {}, timeout=60)


def _stats(url: str, session_id: str, *, wait_s: float = 0.0) -> httpx.Response:
    # The real server publishes statistics a fraction of a second after each step.
    deadline = time.monotonic() + wait_s
    while True:
        r = httpx.get(url + wire.SESSION_STATS_PATH + session_id, timeout=10)
        if r.status_code != 404 or time.monotonic() >= deadline:
            return r
        time.sleep(0.1)


def _shape(value: Any) -> Any:
    """Keys and value types, recursively; the values themselves may differ. A mapping
    whose keys are data (levels that drafted) counts by its type alone."""
    if isinstance(value, dict):
        return {k: "dict" if k == "accepted_tokens_by_level" else _shape(v) for k, v in value.items()}
    return type(value).__name__


BAD_REQUESTS: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("bad session header", {}, {wire.SESSION_HEADER: "a b"}),
    ("bad group in xargs", {"vllm_xargs": {"group_id": "é"}}, {}),
    ("seeds not a list", {"agentspec_seeds": {"text": "x"}, "prompt_cache_key": "s"}, {}),
    ("unknown seed kind", {"agentspec_seeds": [{"text": "x", "kind": "secret"}]}, {wire.SESSION_HEADER: "s"}),
    ("session seed without session", {"agentspec_seeds": [{"text": "x"}]}, {}),
    ("too many seeds", {"agentspec_seeds": [{"token_ids": [1]}] * 17}, {wire.SESSION_HEADER: "s"}),
    ("token id out of vocabulary", {"agentspec_seeds": [{"token_ids": [4096]}]}, {wire.SESSION_HEADER: "s"}),
]


@pytest.mark.parametrize(("name", "body", "headers"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_refusals_match(agentspec_server, stub, name: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    real = _chat(agentspec_server.url, headers=headers, **body)
    fake = _chat(stub.url, headers=headers, **body)
    assert (real.status_code, fake.status_code) == (400, 400), (real.text, fake.text)
    assert _shape(real.json()) == _shape(fake.json())
    assert real.json()["error"]["message"] == fake.json()["error"]["message"]
    assert real.json()["error"]["param"] == fake.json()["error"]["param"]
    assert real.headers["content-type"].startswith("application/json")
    assert fake.headers["content-type"].startswith("application/json")


def test_session_stats_match(agentspec_server, stub) -> None:
    sid = f"shape-{time.monotonic_ns()}"
    seeds = [{"token_ids": [5, 6, 7], "kind": "document"}]
    for url in (agentspec_server.url, stub.url):
        r = _chat(url, headers={wire.SESSION_HEADER: sid, wire.GROUP_HEADER: "shape-g"}, agentspec_seeds=seeds)
        assert r.status_code == 200, r.text
    real = _stats(agentspec_server.url, sid, wait_s=10)
    fake = _stats(stub.url, sid)
    assert (real.status_code, fake.status_code) == (200, 200), real.text
    assert tuple(real.json()) == tuple(fake.json()) == wire.SESSION_STATS_FIELDS
    assert _shape(real.json()) == _shape(fake.json())
    for body in (real.json(), fake.json()):
        assert body["session_id"] == sid and body["group_id"] == "shape-g"
        assert body["seeded_tokens"] == 3 and body["calls"] == 1


@pytest.mark.parametrize("session_id", ["never-seen", "a%20b"])
def test_stats_refusals_match(agentspec_server, stub, session_id: str) -> None:
    real = _stats(agentspec_server.url, session_id)
    fake = _stats(stub.url, session_id)
    assert real.status_code == fake.status_code and real.status_code in (400, 404)
    assert _shape(real.json()) == _shape(fake.json())
    assert real.json()["error"]["type"] == fake.json()["error"]["type"]


SEED_ONLY_REFUSALS: list[tuple[str, Any]] = [
    ("not an object", []),
    ("unknown field", {"agentspec_seeds": [{"text": "x"}], "messages": []}),
    ("no seeds", {"agentspec_seeds": []}),
    ("reserved xarg", {"agentspec_seeds": [{"text": "x"}], "vllm_xargs": {"agentspec_seed_only": 1}}),
    ("bad kind", {"agentspec_seeds": [{"text": "x", "kind": "secret"}]}),
]


@pytest.mark.parametrize(("name", "body"), SEED_ONLY_REFUSALS, ids=[r[0] for r in SEED_ONLY_REFUSALS])
def test_seed_only_refusals_match(agentspec_server, stub, name: str, body: Any) -> None:
    answers = [
        httpx.post(url + wire.SEEDS_PATH, json=body, headers={wire.SESSION_HEADER: "s"}, timeout=60)
        for url in (agentspec_server.url, stub.url)
    ]
    real, fake = (a.json() for a in answers)
    assert [a.status_code for a in answers] == [400, 400]
    assert real == fake


def test_seed_only_request_seeds_without_a_call(agentspec_server, stub) -> None:
    sid = f"seed-only-{time.monotonic_ns()}"
    body = {
        "agentspec_seeds": [{"token_ids": [11, 12, 13, 14], "kind": "document"}],
        "vllm_xargs": {"group_id": "so-g"},
    }
    answers = [
        httpx.post(url + wire.SEEDS_PATH, json=body, headers={wire.SESSION_HEADER: sid}, timeout=60)
        for url in (agentspec_server.url, stub.url)
    ]
    assert [a.status_code for a in answers] == [200, 200], answers[0].text
    assert answers[0].json() == answers[1].json() == {"session_id": sid, "group_id": "so-g", "seeded_tokens": 4}
    stats = _stats(agentspec_server.url, sid, wait_s=10)
    assert stats.status_code == 200, stats.text
    # The seeds reached the session's index; the one-token carrier was neither a call nor indexed.
    assert stats.json()["seeded_tokens"] == 4
    assert stats.json()["calls"] == 0 and stats.json()["indexed_tokens"] == 0


def _events(url: str, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[len("data: ") :]))
    return out


def _token_id_fields(chunks: list[dict[str, Any]], *, chat: bool) -> list[tuple[str, str]]:
    """Where a stream with ``return_token_ids`` carries ids, and their types."""
    first = chunks[0] if chat else chunks[0]["choices"][0]
    fields = [("prompt_token_ids", type(first.get("prompt_token_ids")).__name__)]
    with_output = [c for c in chunks if c.get("choices") and c["choices"][0].get("token_ids")]
    fields.append(("token_ids", type(with_output[0]["choices"][0]["token_ids"]).__name__))
    return fields


def test_streams_carry_token_ids_alike(agentspec_server, stub) -> None:
    # What a client resuming a cut stream reads: the prompt's ids and each chunk's ids.
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    chat["return_token_ids"] = True
    real = _events(agentspec_server.url, "/v1/chat/completions", chat)
    ours = _events(stub.url, "/v1/chat/completions", chat)
    expected = [("prompt_token_ids", "list"), ("token_ids", "list")]
    assert _token_id_fields(real, chat=True) == _token_id_fields(ours, chat=True) == expected
    assert all(isinstance(t, int) for t in real[0]["prompt_token_ids"] + ours[0]["prompt_token_ids"])
    completion = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4, "stream": True, "return_token_ids": True}
    real = _events(agentspec_server.url, "/v1/completions", completion)
    ours = _events(stub.url, "/v1/completions", completion)
    assert _token_id_fields(real, chat=False) == _token_id_fields(ours, chat=False)
    assert real[0]["object"] == ours[0]["object"] == "text_completion"
    assert set(real[0]["choices"][0]) >= set(ours[0]["choices"][0])
