"""Against a real ``agentspec serve`` with API keys: no agentspec work before vLLM's key
check, malformed bodies refused with a 400 (never a 500), ambiguous id headers refused, and
agentspec keys smuggled past the middleware ignored.

Slow (its own server with two API keys); marked ``server``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from agentspec import wire
from agentspec.testing.pytest_plugin import SECURED_API_KEYS

pytestmark = pytest.mark.server

KEY_A, KEY_B = SECURED_API_KEYS
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
# A seed the middleware would refuse with a 400 once it looked at it.
BAD_SEED = {"agentspec_seeds": [{"text": "x", "kind": "no-such-kind"}]}


def _auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _request(server, method: str, path: str, key: str | None, **kwargs: Any) -> httpx.Response:
    headers = {**_auth(key), **kwargs.pop("headers", {})}
    return httpx.request(method, server.url + path, headers=headers, timeout=60, **kwargs)


GUARDED: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/chat/completions", {"json": {**CHAT, **BAD_SEED}, "headers": {wire.SESSION_HEADER: "s"}}),
    ("POST", "/sessions/s1/v1/chat/completions", {"json": {**CHAT, **BAD_SEED}}),
    ("POST", "/sessions/not an id/v1/chat/completions", {"json": CHAT}),
    ("POST", wire.SEEDS_PATH, {"json": BAD_SEED, "headers": {wire.SESSION_HEADER: "s"}}),
    ("GET", wire.SESSION_STATS_PATH + "s", {}),
    ("GET", wire.SERVER_STATS_PATH, {}),
]


@pytest.mark.parametrize(("method", "path", "kwargs"), GUARDED, ids=[g[1] for g in GUARDED])
@pytest.mark.parametrize("key", [None, "wrong-key"], ids=["no key", "wrong key"])
def test_no_agentspec_work_before_authentication(
    agentspec_secured_server, method: str, path: str, kwargs: dict[str, Any], key: str | None
) -> None:
    # The body would be a 400 (bad seed kind, bad id) if agentspec looked at it first.
    r = _request(agentspec_secured_server, method, path, key, **kwargs)
    assert r.status_code == 401, r.text
    assert r.json() == {"error": "Unauthorized"}  # vLLM's own answer


@pytest.mark.parametrize("key", SECURED_API_KEYS)
def test_each_key_is_let_in_and_then_validated(agentspec_secured_server, key: str) -> None:
    server = agentspec_secured_server
    refused = _request(server, "POST", "/v1/chat/completions", key, json={**CHAT, **BAD_SEED},
                       headers={wire.SESSION_HEADER: "s"})  # fmt: skip
    assert refused.status_code == 400 and "kind must be one of" in refused.json()["error"]["message"]
    ok = _request(server, "POST", "/sessions/sec-s/v1/chat/completions", key, json=CHAT)
    assert ok.status_code == 200, ok.text
    seeded = _request(server, "POST", wire.SEEDS_PATH, key, json={"agentspec_seeds": [{"token_ids": [1, 2]}]},
                      headers={wire.SESSION_HEADER: "sec-s"})  # fmt: skip
    assert seeded.status_code == 200 and seeded.json()["seeded_tokens"] == 2
    assert _request(server, "GET", wire.SERVER_STATS_PATH, key).status_code == 200


def test_open_paths_stay_open(agentspec_secured_server) -> None:
    # As vLLM leaves them: health for load balancers, metrics for scrapers.
    assert _request(agentspec_secured_server, "GET", "/health", None).status_code == 200
    metrics = _request(agentspec_secured_server, "GET", "/metrics", None)
    assert metrics.status_code == 200 and b"agentspec_" in metrics.content


@pytest.mark.parametrize("path", ["/v1/chat/completions", wire.SEEDS_PATH])
def test_deeply_nested_json_is_a_400(agentspec_secured_server, path: str) -> None:
    body = b"[" * 2000 + b"]" * 2000
    r = _request(agentspec_secured_server, "POST", path, KEY_A, content=body,
                 headers={"content-type": "application/json", wire.SESSION_HEADER: "s"})  # fmt: skip
    assert r.status_code == 400, r.text


def test_disagreeing_duplicate_id_headers_are_refused(agentspec_secured_server) -> None:
    url = agentspec_secured_server.url + "/v1/chat/completions"
    headers = [("Authorization", f"Bearer {KEY_A}"), (wire.SESSION_HEADER, "s1"), (wire.SESSION_HEADER, "s2")]
    r = httpx.post(url, json=CHAT, headers=headers, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["message"] == f"header {wire.SESSION_HEADER} appears 2 times with different values"
    same = [("Authorization", f"Bearer {KEY_A}"), (wire.SESSION_HEADER, "s1"), (wire.SESSION_HEADER, "s1")]
    assert httpx.post(url, json=CHAT, headers=same, timeout=60).status_code == 200


def test_an_oversized_text_seed_is_refused(agentspec_secured_server) -> None:
    # 1 MiB of text: refused by the character bound before any tokenizing.
    seeds = {"agentspec_seeds": [{"text": "a" * 1_048_577}]}
    r = _request(agentspec_secured_server, "POST", "/v1/chat/completions", KEY_A, json={**CHAT, **seeds},
                 headers={wire.SESSION_HEADER: "s"})  # fmt: skip
    assert r.status_code == 400 and "max_seed_tokens_per_request" in r.json()["error"]["message"]
    # Just under the character bound but far over the token limit: tokenized a chunk at a
    # time and abandoned once over the limit.
    words = {"agentspec_seeds": [{"text": "word " * 200_000}]}
    r = _request(agentspec_secured_server, "POST", "/v1/chat/completions", KEY_A, json={**CHAT, **words},
                 headers={wire.SESSION_HEADER: "s"})  # fmt: skip
    assert r.status_code == 400 and "max_seed_tokens_per_request=32768" in r.json()["error"]["message"]


def _engine_count(server, name: str) -> float:
    r = _request(server, "GET", wire.SERVER_STATS_PATH, KEY_A)
    return float(r.raise_for_status().json()["engine"].get(name, 0))


def test_agentspec_keys_on_a_route_the_middleware_does_not_see_are_ignored(agentspec_secured_server) -> None:
    """vLLM's token-in route (/inference/v1/generate, scale-out) carries ``extra_args`` to the
    engine untouched by agentspec's middleware. A caller with a valid key who names another
    tenant, a session and a seed there gets none of it: without the middleware's stamp the
    engine runs the request without agentspec."""
    server = agentspec_secured_server
    before = _engine_count(server, "unadmitted_requests_total")
    smuggled = {
        wire.XARG_SESSION: "smuggled",
        wire.XARG_TENANT: "someone-else",
        wire.XARG_SEEDS: '[{"token_ids": [5, 6, 7], "scope": "session", "kind": "prior_turn"}]',
        wire.XARG_ADMISSION: "a guess",
    }
    body = {"model": "tiny", "token_ids": [11, 12, 13], "sampling_params": {"max_tokens": 4, "extra_args": smuggled}}
    r = _request(server, "POST", "/inference/v1/generate", KEY_A, json=body)
    assert r.status_code == 200, r.text  # vLLM serves it ...
    for key in (KEY_A, KEY_B):  # ... and agentspec holds nothing of it, in any tenant
        assert _request(server, "GET", wire.SESSION_STATS_PATH + "smuggled", key).status_code == 404
    deadline = 50
    while _engine_count(server, "unadmitted_requests_total") <= before and deadline:
        time.sleep(0.2)
        deadline -= 1
    assert _engine_count(server, "unadmitted_requests_total") == before + 1


def test_a_caller_cannot_forge_the_admission_stamp(agentspec_secured_server) -> None:
    body = {**CHAT, "vllm_xargs": {wire.XARG_ADMISSION: "forged"}}
    r = _request(agentspec_secured_server, "POST", "/v1/chat/completions", KEY_A, json=body)
    assert r.status_code == 400 and f"vllm_xargs.{wire.XARG_ADMISSION} is reserved" in r.text
