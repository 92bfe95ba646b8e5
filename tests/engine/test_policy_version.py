"""``POST /agentspec/v1/policy``: a new policy version (RL weight updates) retires what older
versions generated from group and global drafting, unless the caller keeps it."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from engine_helpers import MODEL, completion_ok, server_stats, wait_for, wait_session

from agentspec import wire

pytestmark = pytest.mark.server

#: Greedy decoding of the same prompt gives the same output: a sibling can draft all of it.
PROMPT = "def retire(outputs, version):\n    kept = ["


def _sibling(base: str, group: str) -> dict[str, Any]:
    sid = f"pol-{uuid.uuid4().hex[:8]}"
    completion_ok(base, PROMPT, max_tokens=40, vllm_xargs={"session_id": sid, "group_id": group})
    return wait_session(base, sid, calls=1)


def _accepted(stats: dict[str, Any]) -> int:
    return int(stats["accepted_tokens"])


def _announce(base: str, version: int, **body: Any) -> httpx.Response:
    return httpx.post(base + wire.POLICY_PATH, json={"version": version, **body}, timeout=60)


def _version(base: str) -> float | None:
    return server_stats(base)["engine"].get("policy_version")


def test_a_new_policy_retires_old_outputs_from_group_and_global_drafting(agentspec_server: Any) -> None:
    base, group = agentspec_server.url, f"pol-g-{uuid.uuid4().hex[:6]}"
    _sibling(base, group)
    copied = _accepted(_sibling(base, group))  # a sibling drafts the first one's whole output
    current = int(_version(base) or 0)
    r = _announce(base, current + 1)
    assert r.status_code == 200, r.text
    assert r.json() == {"version": current + 1, "keep_old_outputs": False}
    engine = wait_for(lambda: server_stats(base)["engine"], lambda e: e.get("policy_version") == current + 1)
    assert engine["retired_output_tokens_total"] > 0
    # The old outputs no longer draft for the group (nor from the global corpus): the next
    # sibling drafts only from what it writes itself, far less than a copy.
    assert _accepted(_sibling(base, group)) < copied
    # Outputs of the new version draft as before.
    assert _accepted(_sibling(base, group)) == copied


def test_keeping_old_outputs_keeps_them_drafting(agentspec_server: Any) -> None:
    base, group = agentspec_server.url, f"pol-k-{uuid.uuid4().hex[:6]}"
    _sibling(base, group)
    copied = _accepted(_sibling(base, group))
    current = int(_version(base) or 0)
    assert _announce(base, current + 1, keep_old_outputs=True).status_code == 200
    wait_for(lambda: _version(base), lambda v: v == current + 1)
    assert _accepted(_sibling(base, group)) == copied


def test_an_older_version_is_refused_naming_both_and_the_live_one_again_is_harmless(agentspec_server: Any) -> None:
    base = agentspec_server.url
    current = int(_version(base) or 0)
    assert _announce(base, current + 1).status_code == 200
    engine = wait_for(lambda: server_stats(base)["engine"], lambda e: e.get("policy_version") == current + 1)
    before, finished = engine["policy_updates_total"], engine.get("calls_finished_total", 0)
    r = _announce(base, current)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["param"] == "version" and r.json()["error"]["code"] == 409
    assert f"policy version {current} is older than the live one ({current + 1})" in r.json()["error"]["message"]
    # The live version again (a retried announcement) is accepted and changes nothing.
    r = _announce(base, current + 1)
    assert r.status_code == 200 and r.json() == {"version": current + 1, "keep_old_outputs": False}
    completion_ok(base, PROMPT, max_tokens=2)  # a request after both, so the published figures include them
    engine = wait_for(lambda: server_stats(base)["engine"], lambda e: e.get("calls_finished_total", 0) > finished)
    assert engine["policy_version"] == current + 1 and engine["policy_updates_total"] == before


def test_a_request_in_flight_finishes_under_the_version_it_started_with(agentspec_server: Any) -> None:
    base, group, sid = agentspec_server.url, f"pol-f-{uuid.uuid4().hex[:6]}", f"pol-{uuid.uuid4().hex[:8]}"
    old = int(_version(base) or 0) + 1
    assert _announce(base, old).status_code == 200
    wait_for(lambda: _version(base), lambda v: v == old)
    _sibling(base, group)  # a finished sibling, so that the request in flight drafts
    payload = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": 300,
        "temperature": 0,
        "ignore_eos": True,  # long enough to be still generating when the update is answered
        "stream": True,
        "vllm_xargs": {"session_id": sid, "group_id": group},
    }
    with httpx.stream("POST", base + "/v1/completions", json=payload, timeout=120) as r:
        chunks = (line for line in r.iter_lines() if line.startswith("data: "))
        next(chunks)  # it is generating
        assert _announce(base, old + 1).status_code == 200
        after_update = list(chunks)
    assert after_update[-1] == "data: [DONE]" and len(after_update) > 1, "the request ended before the update"
    stats = wait_session(base, sid, calls=1)
    assert stats["policy_version"] == old
    assert set(stats["draft_tokens_by_policy_version"]) == {str(old)}  # all its drafts: under the old version
    assert set(stats["accepted_tokens_by_policy_version"]) <= {str(old)}
    # The session's next call runs under the new one.
    completion_ok(base, PROMPT, max_tokens=4, vllm_xargs={"session_id": sid, "group_id": group})
    assert wait_session(base, sid, calls=2)["policy_version"] == old + 1


@pytest.mark.parametrize(
    ("body", "message", "param"),
    [
        ({"version": -1}, "version must be a non-negative integer", "version"),
        ({"version": "7"}, "version must be a non-negative integer", "version"),
        ({"version": True}, "version must be a non-negative integer", "version"),
        ({"version": 1, "keep_old_outputs": "yes"}, "keep_old_outputs must be true or false", "keep_old_outputs"),
        ({"version": 1, "flush": True}, "unknown field 'flush'", "flush"),
    ],
)
def test_bad_policy_requests_are_refused_naming_the_field(
    agentspec_server: Any, body: dict[str, Any], message: str, param: str
) -> None:
    r = httpx.post(agentspec_server.url + wire.POLICY_PATH, json=body, timeout=30)
    assert r.status_code == 400 and message in r.json()["error"]["message"] and r.json()["error"]["param"] == param


def test_callers_cannot_set_a_version_on_a_request(agentspec_server: Any) -> None:
    r = httpx.post(
        agentspec_server.url + "/v1/completions",
        json={"model": MODEL, "prompt": "x", "max_tokens": 1, "vllm_xargs": {wire.XARG_POLICY_VERSION: 9}},
        timeout=30,
    )
    assert r.status_code == 400 and f"POST {wire.POLICY_PATH}" in r.json()["error"]["message"]
