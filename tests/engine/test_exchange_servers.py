"""Corpus exchange between two real ``agentspec serve`` replicas sharing a folder."""

from __future__ import annotations

import uuid

import httpx
import pytest
from engine_helpers import PROMPTS, chat_ok, completion_ok, server_stats, wait_for

from agentspec import wire
from agentspec.testing.pytest_plugin import TEST_INDEX_CONFIG

pytestmark = pytest.mark.server


def _engine(stats: dict, key: str) -> float:
    return stats["engine"].get(key, 0)


def _global_tokens(stats: dict) -> int:
    return stats["index"].get("global_tokens", 0)  # absent before the first snapshot


def _same_policy_version(main: str, peer: str) -> None:
    """Bring ``peer`` to ``main``'s policy version: an earlier test may have announced one to
    ``main``, which then retires (does not index) what older versions generated."""
    version = int(server_stats(main)["engine"].get("policy_version") or 0)
    if version > int(server_stats(peer)["engine"].get("policy_version") or 0):
        r = httpx.post(peer + wire.POLICY_PATH, json={"version": version, "keep_old_outputs": True}, timeout=60)
        assert r.status_code == 200, r.text
        wait_for(lambda: server_stats(peer)["engine"], lambda e: e.get("policy_version") == version)


def test_peer_output_reaches_the_other_replica(agentspec_server, agentspec_peer_server) -> None:
    main, peer = agentspec_server.url, agentspec_peer_server.url
    _same_policy_version(main, peer)
    before = server_stats(main)
    peer_before = server_stats(peer)

    sid = f"exchange-{uuid.uuid4().hex[:10]}"
    messages = [{"role": "user", "content": f"{PROMPTS[3]} # {sid}"}]
    out = chat_ok(peer, messages, max_tokens=32, ignore_eos=True, headers={"X-Session-Id": sid})
    n = len(out["choices"][0]["token_ids"])
    assert n == 32
    wait_for(
        lambda: server_stats(peer),
        lambda s: _engine(s, "exchange_published_total") > _engine(peer_before, "exchange_published_total"),
        timeout=30,
    )

    # An idle engine does not step, so it does not poll: the main replica takes the
    # peer's record in at its next step, which a one-token request brings about.
    def poke_and_fetch() -> dict:
        completion_ok(main, [7, 8, 9], max_tokens=1)
        return server_stats(main)

    after = wait_for(
        poke_and_fetch,
        lambda s: _engine(s, "exchange_received_total") > _engine(before, "exchange_received_total"),
        timeout=30,
    )
    received = _engine(after, "exchange_received_tokens_total") - _engine(before, "exchange_received_tokens_total")
    assert received >= n
    if _global_tokens(before) + received < TEST_INDEX_CONFIG.global_max_tokens - 10_000:
        # (Near its budget the global corpus drops its oldest text, and need not grow.)
        assert _global_tokens(after) - _global_tokens(before) >= received
