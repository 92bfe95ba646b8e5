"""The sync client against two stub servers over real HTTP."""

from __future__ import annotations

import time

import pytest

from agentspec.client import (
    AgentSpecClient,
    ClientClosedError,
    ClientConfig,
    InvalidIdError,
    InvalidSeedError,
    NoHealthyBackendError,
    ServerRefusedError,
    SessionClosedError,
    SessionNotFoundError,
    StreamInterruptedError,
)

USER = [{"role": "user", "content": "hello there"}]


def test_every_request_carries_the_ids(config, stubs, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session("s-1", group_id="g-1") as s:
        s.chat(USER)
        s.stream_chat(USER).until_done()
        s.complete_tokens([1, 2, 3], max_tokens=2)
        reqs = stub_at(s.backend).generation_requests()
    assert len(reqs) == 3
    for r in reqs:
        assert r.headers["x-session-id"] == "s-1"
        assert r.headers["x-group-id"] == "g-1"
        assert r.headers["authorization"] == "Bearer secret"
        assert r.body["vllm_xargs"] == {"session_id": "s-1", "group_id": "g-1"}


def test_generated_ids_and_default_group(config) -> None:
    with AgentSpecClient(config) as client:
        a, b = client.session(), client.session()
        assert a.session_id != b.session_id
        assert a.group_id == a.session_id  # no group: the session is its own group
        a.chat(USER)
        assert a.turns[0].backend == a.backend


def test_chat_result_and_passthrough(config, stub_at) -> None:
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    with AgentSpecClient(config) as client, client.session() as s:
        r = s.chat(
            USER,
            tools=tools,
            tool_choice="auto",
            max_tokens=7,
            temperature=0.0,
            extra_body={"top_k": 3},
            vllm_xargs={"custom": 1},
        )
        body = stub_at(s.backend).generation_requests()[-1].body
    assert r.finish_reason == "tool_calls"
    assert r.tool_calls[0]["function"]["name"] == "run"
    assert r.content is None
    assert body["max_tokens"] == 7 and body["temperature"] == 0.0 and body["top_k"] == 3
    assert body["tools"] == tools and body["model"] == "stub-model"
    assert body["vllm_xargs"]["custom"] == 1 and body["vllm_xargs"]["session_id"] == s.session_id
    assert "extra_body" not in body


def test_streaming_rebuilds_message_and_records_turn(config) -> None:
    tools = [{"type": "function", "function": {"name": "grep"}}]
    with AgentSpecClient(config) as client, client.session() as s:
        with s.stream_chat(USER, stream_options={"include_usage": True}) as stream:
            chunks = list(stream)
        assert (
            "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            == "echo: hello there"
        )
        assert stream.result is not None and stream.result.content == "echo: hello there"
        assert stream.result.usage is not None
        tool_result = s.stream_chat(USER, tools=tools, tool_choice="auto").until_done()
        assert tool_result.tool_calls[0]["function"]["name"] == "grep"
        assert [t.streamed for t in s.turns] == [True, True]


def test_token_in_token_out(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        out = s.complete_tokens([5, 6, 7], max_tokens=3, logprobs=1, return_tokens_as_token_ids=True)
        body = stub_at(s.backend).generation_requests()[-1].body
    assert out.token_ids == (8, 9, 10)
    assert out.prompt_token_ids == (5, 6, 7)
    assert out.logprobs == (-0.5, -0.5, -0.5)
    assert body["prompt"] == [5, 6, 7] and body["return_token_ids"] is True
    assert s.turns[0].output_token_ids == (8, 9, 10)


def test_seed_and_repair_travel_with_next_request_once(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        s.seed("def f(x):\n    return x\n", kind="document")
        s.seed([1, 2, 3], kind="sibling_output", scope="group")
        s.repair("def f(x): retrun x", "SyntaxError: invalid syntax")
        assert len(s.pending_seeds) == 4
        s.chat(USER)
        s.chat(USER)
        first, second = stub_at(s.backend).generation_requests()
    assert [seed["kind"] for seed in first.body["agentspec_seeds"]] == [
        "document",
        "sibling_output",
        "repair_attempt",
        "document",
    ]
    assert first.body["agentspec_seeds"][1] == {
        "kind": "sibling_output",
        "scope": "group",
        "token_ids": [1, 2, 3],
    }
    assert "agentspec_seeds" not in second.body
    assert s.pending_seeds == ()


def test_bad_seeds_are_refused_locally(config) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        with pytest.raises(InvalidSeedError):
            s.seed("")
        with pytest.raises(InvalidSeedError):
            s.seed("x", kind="bogus")
        with pytest.raises(InvalidSeedError):
            s.seed([1, -2])
        with pytest.raises(InvalidSeedError):
            s.seed("x", scope="tenant")
        for _ in range(config.max_seeds_per_request):
            s.seed("x")
        with pytest.raises(InvalidSeedError, match="at most 16"):
            s.seed("one too many")


@pytest.mark.parametrize("bad", ["", "a" * 129, "has space", "semi;colon", "ü"])
def test_invalid_ids(config, bad) -> None:
    with AgentSpecClient(config) as client:
        with pytest.raises(InvalidIdError):
            client.session(bad)
        with pytest.raises(InvalidIdError):
            client.session("ok", group_id=bad)
        with pytest.raises(ValueError):  # InvalidIdError is a ValueError too
            client.session(bad)


def test_valid_ids_with_every_allowed_character(config, stub_at) -> None:
    sid = "Aa0._:@/-" + "x" * 119
    with AgentSpecClient(config) as client, client.session(sid) as s:
        s.chat(USER)
        assert s.stats().session_id == sid  # '/' survives the stats URL


def test_closed_session_and_client(config) -> None:
    client = AgentSpecClient(config)
    s = client.session()
    s.close()
    s.close()  # idempotent
    for call in (
        lambda: s.chat(USER),
        lambda: s.stream_chat(USER),
        lambda: s.seed("x"),
        lambda: s.complete_tokens([1]),
        s.stats,
    ):
        with pytest.raises(SessionClosedError):
            call()
    live = client.session()
    client.close()
    with pytest.raises(SessionClosedError):
        live.chat(USER)
    with pytest.raises(ClientClosedError):
        client.session()


def test_bad_request_shape_is_caught_before_sending(config, stubs) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        with pytest.raises(ValueError):
            s.chat([])
        with pytest.raises(ValueError):
            s.chat([{"content": "no role"}])
        with pytest.raises(TypeError):
            s.chat(USER, stream=True)
        with pytest.raises(ValueError):
            s.complete_tokens([])
        with pytest.raises(TypeError):
            s.complete_tokens("text")  # type: ignore[arg-type]
    assert not any(stub.generation_requests() for stub in stubs)


def test_server_refusal_carries_the_servers_message(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        s.chat(USER)
        stub_at(s.backend).fail_next(1, status=400)
        with pytest.raises(ServerRefusedError) as info:
            s.chat(USER)
        assert info.value.status_code == 400
        assert info.value.message == "injected failure"
        assert len(s.turns) == 1
        # A refusal is the request's fault: the backend stays up.
        assert client.healthy_backends() == list(client.backends)


def test_stats_of_unknown_session(config) -> None:
    with AgentSpecClient(config) as client, client.session() as s, pytest.raises(SessionNotFoundError):
        s.stats()


def test_group_sessions_share_a_backend_and_groups_spread(config) -> None:
    with AgentSpecClient(config) as client:
        group = [client.session(group_id="grp") for _ in range(5)]
        for s in group:
            s.chat(USER)
        assert len({s.backend for s in group}) == 1
        loners = [client.session() for _ in range(20)]
        for s in loners:
            s.chat(USER)
        assert len({s.backend for s in loners}) == 2
        assert sum(client.loads().values()) == 25


def test_5xx_fails_over_and_reseeds_history(config, stubs, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session(group_id="fo") as s:
        s.seed("a document to rewrite", kind="document")
        s.chat([{"role": "user", "content": "turn one"}])
        s.complete_tokens([1, 2], max_tokens=2)
        first = stub_at(s.backend)
        other = next(x for x in stubs if x is not first)
        first.fail_next(5, status=503)
        r = s.chat([{"role": "user", "content": "turn two"}])
        assert r.backend == other.url and r.turn.attempts == 2
        assert client.healthy_backends() == [other.url]
        seeds = other.generation_requests()[-1].body["agentspec_seeds"]
        assert {"kind": "document", "scope": "session", "text": "a document to rewrite"} in seeds
        assert {"kind": "prior_turn", "scope": "session", "text": "turn one\necho: turn one"} in seeds
        assert {"kind": "prior_turn", "scope": "session", "token_ids": [1, 2, 3, 4]} in seeds
        assert s.stats().seeded_tokens > 0
        # Only the move carries history: the next call does not repeat it.
        s.chat([{"role": "user", "content": "turn three"}])
        assert "agentspec_seeds" not in other.generation_requests()[-1].body
        assert [t.kind for t in s.turns] == ["chat", "tokens", "chat", "chat"]
        assert [t.index for t in s.turns] == [0, 1, 2, 3]


def test_dead_backend_fails_over_and_recovery_takes_only_new_sessions(config, stubs, stub_at) -> None:
    with AgentSpecClient(config) as client:
        s = client.session(group_id="dead")
        s.chat(USER)
        dead = stub_at(s.backend)
        alive = next(x for x in stubs if x is not dead)
        dead.stop()
        r = s.chat(USER)
        assert r.backend == alive.url
        assert client.backend_states()[dead.url].up is False
        dead.start()
        client.check_health()
        assert client.backend_states()[dead.url].up is True
        s.chat(USER)
        assert s.backend == alive.url  # pinned sessions stay where they moved
        assert client.pinned_backend("dead") == alive.url
        # New groups see the recovered backend again (least loaded and healthy).
        fresh = [client.session() for _ in range(6)]
        for f in fresh:
            f.chat(USER)
        assert dead.url in {f.backend for f in fresh}


def test_no_healthy_backend(config, stubs) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        for stub in stubs:
            stub.stop()
        with pytest.raises(NoHealthyBackendError) as info:
            s.chat(USER)
        assert set(info.value.backends) == {x.url for x in stubs}
        assert s.turns == ()
        # The inline probe brings them back once they answer again.
        for stub in stubs:
            stub.start()
        assert s.chat(USER).content == "echo: hello there"


def test_unhealthy_health_endpoint_marks_down(config, stubs) -> None:
    with AgentSpecClient(config) as client:
        stubs[0].healthy = False
        states = client.check_health()
        assert states[stubs[0].url].up is False
        assert states[stubs[1].url].up is True
        with client.session() as s:
            assert s.chat(USER).backend == stubs[1].url


def test_stream_failure_before_output_is_retried(config, stubs, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        s.chat(USER)
        first = stub_at(s.backend)
        first.cut_stream_after = 0  # role chunk only, then the connection drops
        result = s.stream_chat(USER).until_done()
        assert result.backend != first.url and result.turn.attempts == 2
        assert result.content == "echo: hello there"


def test_stream_cut_midway_says_what_was_received(config, stub_at) -> None:
    # A stream that cannot be resumed (tools: the chat endpoint parses its output).
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    with AgentSpecClient(config) as client, client.session() as s:
        s.chat(USER)
        first = stub_at(s.backend)
        first.cut_stream_after = 2
        stream = s.stream_chat([{"role": "user", "content": "one two three four"}], tools=tools, tool_choice="auto")
        with pytest.raises(StreamInterruptedError) as info:
            for _chunk in stream:
                pass
        assert info.value.received_text == "echo: one"
        assert info.value.backend == first.url
        assert "echo: one" in str(info.value)
        assert len(s.turns) == 1  # the cut call is not a turn
        # The session continues elsewhere, re-seeded.
        r = s.chat(USER)
        assert r.backend != first.url


def test_429_is_retried_on_the_same_backend(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        s.chat(USER)
        home = stub_at(s.backend)
        home.fail_next(1, status=429)
        r = s.chat(USER)
        assert r.backend == home.url and r.turn.attempts == 2
        assert client.healthy_backends() == list(client.backends)


def test_429_waits_for_retry_after(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        s.chat(USER)
        home = stub_at(s.backend)
        home.fail_next(1, status=429, retry_after=1)
        start = time.monotonic()
        r = s.chat(USER)
        waited = time.monotonic() - start
        assert r.backend == home.url and r.turn.attempts == 2
        assert 1.0 <= waited < 5.0  # the server's word, although the test policy has no backoff
        assert client.healthy_backends() == list(client.backends)
        # Retries ran out: the 429 itself, with the server's Retry-After.
        home.fail_next(3, status=429, retry_after=0)
        with pytest.raises(ServerRefusedError) as info:
            s.chat(USER)
        assert info.value.status_code == 429 and info.value.retry_after_s == 0.0


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        ClientConfig(backends=[])
    with pytest.raises(ValueError):
        ClientConfig(backends=["ftp://x"])
    cfg = ClientConfig(backends=["http://a:1/v1/", "http://a:1", "http://b:2/"])
    assert cfg.backends == ("http://a:1", "http://b:2")
    with pytest.raises(TypeError):
        AgentSpecClient(cfg, backends=["http://c:3"])


def test_background_health_thread(stubs) -> None:
    with AgentSpecClient(backends=[s.url for s in stubs], health_check_interval_s=0.05) as client:
        client.session()
        stubs[0].healthy = False
        deadline = time.monotonic() + 5
        while client.backend_states()[stubs[0].url].up and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.backend_states()[stubs[0].url].up is False
