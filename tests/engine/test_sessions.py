"""Sessions, seeds, statistics and lifecycle through a real ``agentspec serve``."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from engine_helpers import (
    MODEL,
    PROMPTS,
    chat,
    chat_ok,
    completion_ok,
    idle_stats,
    session_stats,
    wait_for,
    wait_session,
)

from agentspec.testing.stats import metric_value

pytestmark = pytest.mark.server

MSG = [{"role": "user", "content": "Which transport named this session?"}]


def _sid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------- id transports


@pytest.mark.parametrize(
    "transport",
    ["vllm_xargs", "body_session_id", "x-session-id", "url_prefix", "litellm", "prompt_cache_key", "smg"],
)
def test_each_transport_reaches_the_proposer(agentspec_server, transport: str) -> None:
    base, sid = agentspec_server.url, _sid(transport)
    headers: dict[str, str] = {}
    body: dict[str, Any] = {}
    path = "/v1/chat/completions"
    if transport == "vllm_xargs":
        body["vllm_xargs"] = {"session_id": sid}
    elif transport == "body_session_id":
        body["session_id"] = sid
    elif transport == "x-session-id":
        headers["X-Session-Id"] = sid
    elif transport == "url_prefix":
        path = f"/sessions/{sid}/v1/chat/completions"
    elif transport == "litellm":
        headers["x-litellm-session-id"] = sid
    elif transport == "prompt_cache_key":
        body["prompt_cache_key"] = sid
    else:
        headers["X-SMG-Routing-Key"] = sid
    r = chat(base, MSG, max_tokens=8, headers=headers, path=path, **body)
    assert r.status_code == 200, r.text
    stats = wait_session(base, sid, calls=1)
    assert stats["session_id"] == sid and stats["calls"] == 1


def test_group_header_and_precedence(agentspec_server) -> None:
    base, sid, gid, other = agentspec_server.url, _sid("prec"), _sid("grp"), _sid("lower")
    r = chat(base, MSG, max_tokens=8, headers={"x-litellm-session-id": sid, "X-Group-Id": gid, "X-Session-Id": other},
             prompt_cache_key=other)  # fmt: skip
    assert r.status_code == 200, r.text
    stats = wait_session(base, sid, calls=1)
    assert stats["group_id"] == gid
    assert session_stats(base, other) is None  # lower-precedence forms do not name a second session


def test_url_prefix_serves_other_routes(agentspec_server) -> None:
    r = httpx.get(f"{agentspec_server.url}/sessions/abc/v1/models")
    assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL


def test_without_id_drafts_like_vllm_suffix(agentspec_server) -> None:
    base = agentspec_server.url
    before = idle_stats(base)
    chat_ok(base, [{"role": "user", "content": PROMPTS[2]}], max_tokens=16)
    after = wait_for(
        lambda: idle_stats(base),
        lambda s: s["engine"]["calls_started_total"] == before["engine"]["calls_started_total"] + 1,
    )
    # Drafted (call level), but no session was created for it.
    assert after["index"]["sessions"] == before["index"]["sessions"]


# ---------------------------------------------------------------------------- seeds

SEED_PROMPT = "Seeding probe 6: explain the plan for the refactor of module 42."


def test_seed_raises_acceptance(agentspec_server, plain_server) -> None:
    base = agentspec_server.url
    messages = [{"role": "user", "content": SEED_PROMPT}]
    # The output the model will produce, generated without speculation.
    reference = chat_ok(plain_server.url, messages, max_tokens=64)["choices"][0]["token_ids"]

    plain_sid, seeded_sid = _sid("noseed"), _sid("seeded")
    r1 = chat_ok(base, messages, max_tokens=64, headers={"X-Session-Id": plain_sid})
    unseeded = wait_session(base, plain_sid, calls=1)
    before = metric_value(httpx.get(base + "/metrics").text, "agentspec_accepted_tokens_total", 'level="session"')

    seeds = [{"token_ids": reference, "kind": "prior_turn"}]
    r2 = chat_ok(base, messages, max_tokens=64, headers={"X-Session-Id": seeded_sid}, agentspec_seeds=seeds)
    seeded = wait_session(base, seeded_sid, calls=1)
    after = metric_value(httpx.get(base + "/metrics").text, "agentspec_accepted_tokens_total", 'level="session"')

    assert r1["choices"][0]["token_ids"] == r2["choices"][0]["token_ids"] == reference
    assert seeded["seeded_tokens"] == len(reference)
    n = len(reference)
    assert seeded["accepted_tokens"] >= 0.85 * n, seeded
    assert seeded["accepted_tokens"] >= unseeded["accepted_tokens"] + 0.3 * n, (seeded, unseeded)
    # The drafts came from the seed (session level), not from the global corpus.
    assert after - before >= 0.7 * n


def test_text_seed_is_tokenized_by_the_server(agentspec_server) -> None:
    base, sid = agentspec_server.url, _sid("textseed")
    text = "def parse(text):\n    return text.split()\n"
    tokens = httpx.post(base + "/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": False}).json()
    chat_ok(base, MSG, max_tokens=4, headers={"X-Session-Id": sid},
            agentspec_seeds=[{"text": text, "kind": "repair_attempt"}])  # fmt: skip
    assert wait_session(base, sid, calls=1)["seeded_tokens"] == tokens["count"]


# ---------------------------------------------------------------------------- incremental index


def test_index_is_incremental_across_turns(agentspec_server) -> None:
    """Turn k's prompt is turn k-1's prompt + output + new tokens: only the new tokens are
    indexed (per-call index work proportional to what is new)."""
    base, sid = agentspec_server.url, _sid("incr")
    prompt = [(31 * j) % 3000 + 100 for j in range(300)]
    new_tail = [[(17 * j + 7 * t) % 3000 + 100 for j in range(20)] for t in range(4)]
    for turn in range(4):
        resp = completion_ok(base, prompt, max_tokens=24, vllm_xargs={"session_id": sid})
        stats = wait_session(base, sid, calls=turn + 1)
        if turn == 0:
            assert stats["last_index_new_tokens"] == len(prompt)
        else:
            assert stats["last_index_new_tokens"] == len(new_tail[turn - 1]), stats
        prompt = prompt + resp["choices"][0]["token_ids"] + new_tail[turn]
    # The chat path: the re-rendered history re-indexes at most a few boundary tokens.
    messages = [{"role": "user", "content": PROMPTS[0] * 4}]
    csid = _sid("incr-chat")
    previous_total = 0
    for turn in range(3):
        r = chat_ok(base, messages, max_tokens=24, headers={"X-Session-Id": csid})
        stats = wait_session(base, csid, calls=turn + 1)
        if turn:
            added = r["usage"]["prompt_tokens"] - previous_total
            assert stats["last_index_new_tokens"] <= added + 8, (stats, added)
            assert stats["last_index_new_tokens"] < r["usage"]["prompt_tokens"] // 3
        previous_total = r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
        messages += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"next {turn}"}]  # fmt: skip
    text = httpx.get(base + "/metrics").text
    assert metric_value(text, "agentspec_index_reused_tokens_total") > 0


# ---------------------------------------------------------------------------- bad input


BAD_REQUESTS: list[tuple[str, dict[str, Any], dict[str, str], str]] = [
    ("space in header id", {}, {"X-Session-Id": "bad id"}, "X-Session-Id"),
    ("long group id", {}, {"X-Session-Id": "ok", "X-Group-Id": "g" * 129}, "X-Group-Id"),
    ("int xargs id", {"vllm_xargs": {"session_id": 5}}, {}, "vllm_xargs.session_id"),
    ("cache key", {"prompt_cache_key": "has space"}, {}, "prompt_cache_key"),
    ("seeds not list", {"agentspec_seeds": {"text": "x"}}, {"X-Session-Id": "s"}, "list"),
    ("too many seeds", {"agentspec_seeds": [{"text": "x"}] * 17}, {"X-Session-Id": "s"}, "max_seeds_per_request=16"),
    ("too many tokens", {"agentspec_seeds": [{"token_ids": [1] * 32769}]}, {"X-Session-Id": "s"},
     "max_seed_tokens_per_request=32768"),
    ("huge text", {"agentspec_seeds": [{"text": "x" * 2_000_000}]}, {"X-Session-Id": "s"},
     "max_seed_tokens_per_request"),
    ("id over vocab", {"agentspec_seeds": [{"token_ids": [1, 4096]}]}, {"X-Session-Id": "s"}, "[0, 4096)"),
    ("negative id", {"agentspec_seeds": [{"token_ids": [-1]}]}, {"X-Session-Id": "s"}, "token_ids"),
    ("both", {"agentspec_seeds": [{"text": "a", "token_ids": [1]}]}, {"X-Session-Id": "s"}, "exactly one"),
    ("neither", {"agentspec_seeds": [{"kind": "document"}]}, {"X-Session-Id": "s"}, "exactly one"),
    ("unknown field", {"agentspec_seeds": [{"text": "a", "foo": 1}]}, {"X-Session-Id": "s"}, "unknown field(s) foo"),
    ("bad scope", {"agentspec_seeds": [{"text": "a", "scope": "world"}]}, {"X-Session-Id": "s"}, "scope"),
    ("bad kind", {"agentspec_seeds": [{"text": "a", "kind": "x"}]}, {"X-Session-Id": "s"}, "kind"),
    ("no session", {"agentspec_seeds": [{"text": "a"}]}, {}, "names no session"),
    ("reserved xarg", {"vllm_xargs": {"agentspec_seeds": "[]"}}, {}, "reserved"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "headers", "needle"), [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_is_a_400_naming_the_problem(agentspec_server, body, headers, needle) -> None:
    r = chat(agentspec_server.url, MSG, max_tokens=4, headers=headers, **body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_bad_url_id_and_server_keeps_serving(agentspec_server) -> None:
    base = agentspec_server.url
    r = httpx.post(base + "/sessions/bad%20id/v1/chat/completions", json={"model": MODEL, "messages": MSG})
    assert r.status_code == 400 and "URL" in r.json()["error"]["message"]
    assert httpx.get(base + "/agentspec/v1/sessions/no such").status_code == 400
    assert httpx.get(base + "/agentspec/v1/sessions/never-seen").status_code == 404
    sid = _sid("after-bad")
    chat_ok(base, MSG, max_tokens=8, headers={"X-Session-Id": sid})
    assert wait_session(base, sid, calls=1)["calls"] == 1


# ---------------------------------------------------------------------------- lifecycle


def test_aborted_stream_leaves_no_state(agentspec_server) -> None:
    base, sid = agentspec_server.url, _sid("abort")
    payload = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[5]}], "max_tokens": 1500,
               "temperature": 0, "stream": True, "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", base + "/v1/chat/completions", json=payload, headers={"X-Session-Id": sid}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 5:
                break  # closing the connection mid-stream aborts the request
    stats = idle_stats(base, timeout=30)
    assert stats["index"]["active_calls"] == 0
    text = httpx.get(base + "/metrics").text
    wait_for(lambda: metric_value(httpx.get(base + "/metrics").text, "vllm:num_requests_running"), lambda v: v == 0)
    assert metric_value(text, "agentspec_active_calls") == 0
    # The session itself stays (its text is useful to the next call) until evicted.
    assert session_stats(base, sid) is not None


def test_many_sessions_stay_within_budget(agentspec_server) -> None:
    """The shared test server holds at most 32 sessions (agentspec.testing.pytest_plugin): 40 more evict
    the least recently used, and no finished call is left active."""
    from concurrent.futures import ThreadPoolExecutor

    base = agentspec_server.url
    sids = [_sid("many") for _ in range(40)]

    def one(i: int) -> None:
        completion_ok(base, [100 + i, 200 + i, 300 + i] * 10, max_tokens=2, vllm_xargs={"session_id": sids[i]})

    one(0)  # strictly the oldest of the 40; the rest run concurrently, in no fixed order
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(1, 40)))
    stats = idle_stats(base, timeout=30)
    assert stats["index"]["sessions"] <= 32
    assert stats["index"]["evicted_sessions"] >= 8
    assert stats["index"]["session_tokens"] <= 400_000
    assert session_stats(base, sids[0]) is None and session_stats(base, sids[-1]) is not None
    text = httpx.get(base + "/metrics").text
    assert metric_value(text, "agentspec_sessions") <= 32
    assert metric_value(text, "agentspec_index_memory_bytes") > 0
    assert metric_value(text, "agentspec_evictions_total", 'scope="session"') >= 8
