"""Two real ``agentspec serve`` replicas with only a real ``redis-server`` between them
(``--agentspec-exchange redis://...``): an output finished on one drafts on the other,
tenants stay apart, and a Redis outage costs drafting, never an answer."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from engine_helpers import MODEL, completion_ok, server_stats, wait_for

from agentspec import wire

pytestmark = pytest.mark.server

# Distinctive text, so only the first replica's output can supply global drafts for it.
PROMPT = "Fleet log 4417: the relay schedule below repeats on every node. Copy it. " * 3


def _engine(server, key: str) -> float:
    return server_stats(server.url)["engine"].get(key, 0)


def _call(server, session: str, *, salt: str | None = None, max_tokens: int = 64) -> list[int]:
    """A greedy chat call in its own session and group (``salt``: vLLM's ``cache_salt``,
    which makes a tenant of its own)."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    if salt is not None:
        body[wire.CACHE_SALT_FIELD] = salt
    headers = {wire.SESSION_HEADER: session, wire.GROUP_HEADER: f"g-{session}"}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def _session(server, session: str, salt: str | None = None) -> dict[str, Any]:
    params = {wire.CACHE_SALT_FIELD: salt} if salt else {}

    def fetch() -> dict[str, Any] | None:
        r = httpx.get(server.url + wire.SESSION_STATS_PATH + session, params=params, timeout=10)
        return r.json() if r.status_code == 200 else None

    return wait_for(fetch, lambda s: s is not None and s["calls"] >= 1 and s["draft_steps"] > 0, timeout=20)


def _received_after(receiver, before: float, timeout: float = 30) -> None:
    """Wait until ``receiver`` indexed peer outputs beyond ``before``. An idle engine does
    not step, so it takes them in at its next step: a one-token request brings one about."""

    def poke() -> float:
        completion_ok(receiver.url, [7, 8, 9], max_tokens=1)
        return _engine(receiver, "exchange_received_total")

    wait_for(poke, lambda n: n > before, timeout=timeout)


def test_an_output_finished_on_one_replica_drafts_on_the_other(agentspec_fleet_servers) -> None:
    a, b = agentspec_fleet_servers
    run = uuid.uuid4().hex[:8]
    before = _engine(b, "exchange_received_total")
    out_a = _call(a, f"fleet-a-{run}")
    _received_after(b, before)
    out_b = _call(b, f"fleet-b-{run}")
    assert out_a == out_b  # greedy: b writes what a wrote, so a's output drafts it
    stats = _session(b, f"fleet-b-{run}")
    # Nothing of this text was on b but what came from a, through Redis, into b's global corpus.
    assert stats["accepted_tokens_by_level"].get("global", 0) > 0, stats
    assert _engine(b, "exchange_connected") == 1
    # The engine refreshes its statistics when it steps: a one-token request makes it.
    wait_for(lambda: _call(a, f"poke-{run}", max_tokens=1) and _engine(a, "exchange_sent_total"), lambda n: n > 0)


def test_a_tenants_outputs_reach_no_other_tenant_on_the_other_replica(agentspec_fleet_servers) -> None:
    a, b = agentspec_fleet_servers
    run = uuid.uuid4().hex[:8]
    salt_a, salt_b = f"tenant-a-{run}", f"tenant-b-{run}"
    before = _engine(b, "exchange_received_total")
    _call(a, f"ta-{run}", salt=salt_a)
    _received_after(b, before)
    _call(b, f"tb-{run}", salt=salt_b)  # another tenant, the same text
    _call(b, f"ta2-{run}", salt=salt_a)  # the same tenant: the control, so the test can fail
    other = _session(b, f"tb-{run}", salt_b)
    same = _session(b, f"ta2-{run}", salt_a)
    assert other["accepted_tokens_by_level"].get("global", 0) == 0, other
    assert same["accepted_tokens_by_level"].get("global", 0) > 0, same


def test_a_redis_outage_costs_drafting_never_an_answer(agentspec_fleet_servers, redis_exchange) -> None:
    a, b = agentspec_fleet_servers
    run = uuid.uuid4().hex[:8]
    redis_exchange.stop()
    try:
        # Both replicas keep answering, with the same outputs as ever.
        for server in (a, b):
            assert len(_call(server, f"down-{server.port}-{run}", max_tokens=16)) == 16
        wait_for(lambda: _call(a, f"poke-{run}", max_tokens=1) and _engine(a, "exchange_connected"), lambda v: v == 0)
        outages = _engine(a, "exchange_outages_total")
        assert outages >= 1
    finally:
        redis_exchange.start()  # empty: the restart lost the stream
    before = _engine(b, "exchange_received_total")
    _call(a, f"after-{run}")
    _received_after(b, before)  # the exchange resumed (and a sent what it queued meanwhile)
    wait_for(lambda: _call(a, f"poke2-{run}", max_tokens=1) and _engine(a, "exchange_connected"), lambda v: v == 1)
    assert _engine(a, "exchange_outages_total") == outages
