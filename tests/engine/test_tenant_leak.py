"""A tenant's text never drafts for another tenant, unless the operator shares: the side
channel of "When Speculation Spills Secrets" (arXiv 2411.01076), probed against real servers.

Tenant A generates a continuation; tenant B then sends A's prompt, naming A's group. B's
greedy output is A's, so every draft from A's text would be accepted: B's statistics say
how many accepted tokens each level supplied. Isolated (the default), the levels A's text
feeds (group, global) supply none; on a server that shares across tenants they do, so the
test can fail. Tenants are told apart by API key and by vLLM's ``cache_salt``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from agentspec import wire
from agentspec.testing.pytest_plugin import SECURED_API_KEYS

pytestmark = pytest.mark.server

# Distinctive text, so nothing but A's call could have put its continuation anywhere.
PROMPT = "Archive note 7731: the vault combination follows. Repeat it exactly, then stop. " * 3


def _call(server, *, session: str, group: str, key: str | None, salt: str | None) -> str:
    headers = {wire.SESSION_HEADER: session, wire.GROUP_HEADER: group}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 96,
        "temperature": 0,
        "ignore_eos": True,
        wire.CACHE_SALT_FIELD: salt,
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _stats(server, session: str, key: str | None, salt: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    params = {wire.CACHE_SALT_FIELD: salt}
    deadline = time.monotonic() + 15
    while True:  # the engine publishes statistics a moment after each step
        r = httpx.get(server.url + wire.SESSION_STATS_PATH + session, headers=headers, params=params, timeout=10)
        if r.status_code == 200 and r.json()["draft_steps"] > 0:
            time.sleep(0.5)
            return httpx.get(r.url, headers=headers, timeout=10).json()
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)


def _drafting(stats: dict[str, Any]) -> tuple[int, dict[str, int]]:
    return stats["accepted_tokens"], stats["accepted_tokens_by_level"]


def _probe(server, key_a: str | None, key_b: str | None, *, salt_b: str | None = None) -> tuple[Any, Any, str]:
    """A runs the prompt in group G; B runs it in A's group G; C, a fresh tenant that never
    saw A, runs it as the control. Returns B's and C's drafting figures and the output."""
    run = uuid.uuid4().hex[:8]
    group, salt = f"leak-g-{run}", f"salt-{run}"
    out_a = _call(server, session=f"leak-a-{run}", group=group, key=key_a, salt=salt)
    salt_b = salt if salt_b is None else salt_b + run
    out_b = _call(server, session=f"leak-b-{run}", group=group, key=key_b, salt=salt_b)
    out_c = _call(server, session=f"leak-c-{run}", group=f"ctl-g-{run}", key=key_b, salt=f"control-{run}")
    assert out_a == out_b == out_c  # greedy: B writes exactly what A wrote, so A's text would draft it
    b = _stats(server, f"leak-b-{run}", key_b, salt_b)
    c = _stats(server, f"leak-c-{run}", key_b, f"control-{run}")
    return _drafting(b), _drafting(c), out_a


def test_tenants_by_cache_salt_are_isolated(agentspec_server) -> None:
    # Both without a key, told apart by cache_salt alone.
    b, control, _ = _probe(agentspec_server, None, None, salt_b="other-salt-")
    print(f"by cache_salt: B accepted {b}, control {control}")
    # B drafted exactly as a tenant that never saw A's text: nothing of A's reached it.
    assert b == control


def test_tenants_by_api_key_are_isolated(agentspec_secured_server) -> None:
    key_a, key_b = SECURED_API_KEYS
    # The same cache_salt, different keys: two tenants.
    b, control, _ = _probe(agentspec_secured_server, key_a, key_b)
    print(f"by API key: B accepted {b}, control {control}")
    assert b == control


def test_a_tenant_drafts_from_its_own_group(agentspec_secured_server) -> None:
    key_a, _ = SECURED_API_KEYS
    b, control, _ = _probe(agentspec_secured_server, key_a, key_a)  # B is A's tenant
    print(f"one tenant: B accepted {b}, control {control}")
    assert b[0] > control[0]  # A's output, in B's group and global corpus, drafts for B


def test_sharing_across_tenants_leaks_as_documented(agentspec_server, agentspec_peer_server) -> None:
    # The peer shares across tenants; the control comes from the isolated server, the same
    # model and test settings: what a fresh tenant accepts from its own text.
    shared, _, out = _probe(agentspec_peer_server, None, None, salt_b="other-salt-")
    _, control, out_isolated = _probe(agentspec_server, None, None, salt_b="other-salt-")
    assert out == out_isolated
    print(f"shared across tenants: B accepted {shared}, isolated control {control}")
    assert shared[0] > control[0]


def test_another_tenants_session_is_not_found(agentspec_secured_server) -> None:
    key_a, key_b = SECURED_API_KEYS
    run = uuid.uuid4().hex[:8]
    _call(agentspec_secured_server, session=f"own-{run}", group=f"g-{run}", key=key_a, salt=None)
    url = agentspec_secured_server.url + wire.SESSION_STATS_PATH + f"own-{run}"
    assert httpx.get(url, headers={"Authorization": f"Bearer {key_b}"}, timeout=10).status_code == 404
    assert httpx.get(url, headers={"Authorization": f"Bearer {key_a}"}, timeout=10).status_code == 200
