"""A stream cut after output resumes on another backend from the token ids already
delivered, so the caller sees one uninterrupted chat stream (against the stubs, whose
chat streams carry token ids as vLLM's do with ``return_token_ids``)."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from agentspec.client import (
    AgentSpecClient,
    AsyncAgentSpecClient,
    StreamInterruptedError,
)
from agentspec.testing.stub import stub_render, stub_tokenize

ASK = [{"role": "user", "content": "one two three four five"}]
REPLY = "echo: one two three four five"
READ_TIMEOUT_S = 30.0
BOUND_S = 10.0


def _text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


def _settled(client, stub_at, s):
    s.chat([{"role": "user", "content": "first"}])
    home = stub_at(s.backend)
    other = next(b for b in client.backends if b != s.backend)
    return home, other


def test_cut_stream_resumes_elsewhere_as_one_stream(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        reference = s.stream_chat(ASK)
        uncut = list(reference)
        home, other = _settled(client, stub_at, s)
        home.cut_stream_after = 2
        stream = s.stream_chat(ASK, max_tokens=100, temperature=0.0)
        chunks = list(stream)
        result = stream.result
    assert _text(chunks) == _text(uncut) == REPLY
    assert result is not None and result.content == REPLY and result.finish_reason == "stop"
    assert result.backend == other and result.turn.attempts == 2 and result.turn.streamed
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * len(chunks)
    assert {c["id"] for c in chunks} == {"chatcmpl-stub"}  # one stream, one id
    # The client asked for the token ids; the caller did not, and does not see them.
    assert all("token_ids" not in c["choices"][0] for c in chunks if c.get("choices"))
    assert "prompt_token_ids" not in chunks[0]
    # The resumption: a text completion from the prompt's ids plus the ids delivered.
    resumed = stub_at(other).generation_requests()[-1]
    assert resumed.path == "/v1/completions"
    delivered = stub_tokenize("echo: one")
    assert resumed.body["prompt"] == stub_tokenize(stub_render(ASK)) + delivered
    assert resumed.body["max_tokens"] == 100 - len(delivered)
    assert resumed.body["temperature"] == 0.0 and resumed.body["stream"] is True
    assert resumed.body["return_token_ids"] is True
    assert "messages" not in resumed.body
    assert resumed.body["vllm_xargs"]["session_id"] == s.session_id
    # The new backend is re-seeded with the session's history, as for any failover.
    assert any(seed["text"].startswith("first") for seed in resumed.body["agentspec_seeds"])
    assert [t.backend for t in s.turns] == [home.url, home.url, other]


def test_callers_own_token_ids_are_kept(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        home, _ = _settled(client, stub_at, s)
        home.cut_stream_after = 1
        chunks = list(s.stream_chat(ASK, extra_body={"return_token_ids": True}))
    assert _text(chunks) == REPLY
    ids = [t for c in chunks if c.get("choices") for t in c["choices"][0].get("token_ids") or ()]
    assert ids == stub_tokenize(REPLY)


def test_usage_counts_the_whole_output(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        home, _ = _settled(client, stub_at, s)
        home.cut_stream_after = 2
        result = s.stream_chat(ASK, stream_options={"include_usage": True}).until_done()
    assert result.content == REPLY
    assert result.usage is not None
    assert result.usage["prompt_tokens"] == len(stub_tokenize(stub_render(ASK)))
    assert result.usage["completion_tokens"] == len(stub_tokenize(REPLY))


@pytest.mark.parametrize(
    "params",
    [
        {
            "tools": [{"type": "function", "function": {"name": "run"}}],
            "tool_choice": "auto",
        },
        {"response_format": {"type": "json_object"}},
        {"extra_body": {"structured_outputs": {"regex": ".*"}}},
        {"n": 2},
        {"logprobs": True},
    ],
    ids=["tools", "response_format", "structured_outputs", "n", "logprobs"],
)
def test_streams_that_cannot_be_resumed_exactly_still_raise(config, stub_at, params) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        home, _ = _settled(client, stub_at, s)
        home.cut_stream_after = 1
        with pytest.raises(StreamInterruptedError) as info:
            list(s.stream_chat(ASK, **params))
        assert info.value.received_text == "echo:"
        assert "return_token_ids" not in home.generation_requests()[-1].body
        assert len(s.turns) == 1


def test_resuming_can_be_turned_off(config, stub_at) -> None:
    retry = config.retry.model_copy(update={"resume_streams": False})
    with (
        AgentSpecClient(config.model_copy(update={"retry": retry})) as client,
        client.session() as s,
    ):
        home, _ = _settled(client, stub_at, s)
        home.cut_stream_after = 1
        with pytest.raises(StreamInterruptedError):
            list(s.stream_chat(ASK))
        assert "return_token_ids" not in home.generation_requests()[-1].body


def test_resuming_counts_against_max_attempts(config, stubs, stub_at) -> None:
    retry = config.retry.model_copy(update={"max_attempts": 2})
    with (
        AgentSpecClient(config.model_copy(update={"retry": retry})) as client,
        client.session() as s,
    ):
        home, other = _settled(client, stub_at, s)
        home.cut_stream_after = 1
        stub_at(other).cut_stream_after = 1  # the resumption is cut too
        with pytest.raises(StreamInterruptedError) as info:
            list(s.stream_chat(ASK))
        assert info.value.received_text == "echo: one"  # what both attempts delivered


def test_hung_stream_resumes_when_its_backend_is_marked_down(config, stub_at) -> None:
    config = config.model_copy(update={"read_timeout_s": READ_TIMEOUT_S})
    with AgentSpecClient(config) as client, client.session() as s:
        home, other = _settled(client, stub_at, s)
        home.hang_stream_after = 2
        home.healthy = False
        timer = threading.Timer(0.3, client.check_health)
        timer.start()
        start = time.monotonic()
        chunks = list(s.stream_chat(ASK))
        elapsed = time.monotonic() - start
        timer.join()
    print(f"\nFIGURE sync stream hung after output, resumed: {elapsed:.2f} s (read timeout {READ_TIMEOUT_S:.0f} s)")
    assert elapsed < BOUND_S
    assert _text(chunks) == REPLY
    assert s.turns[-1].backend == other and s.turns[-1].attempts == 2


async def test_async_cut_and_hung_streams_resume(config, stub_at) -> None:
    config = config.model_copy(update={"read_timeout_s": READ_TIMEOUT_S})
    async with AsyncAgentSpecClient(config) as client, client.session() as s:
        await s.chat([{"role": "user", "content": "first"}])
        home = stub_at(s.backend)
        home.cut_stream_after = 3
        stream = s.stream_chat(ASK)
        chunks = [c async for c in stream]
        assert _text(chunks) == REPLY and stream.result is not None
        assert stream.result.backend != home.url and stream.result.turn.attempts == 2

        home = stub_at(s.backend)  # the session moved: hang its new home mid-stream
        home.hang_stream_after = 2
        home.healthy = False

        async def mark_down() -> None:
            await anyio.sleep(0.3)
            await client.check_health()

        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(mark_down)
            result = await s.stream_chat(ASK).until_done()
        elapsed = time.monotonic() - start
    print(f"\nFIGURE async stream hung after output, resumed: {elapsed:.2f} s (read timeout {READ_TIMEOUT_S:.0f} s)")
    assert elapsed < BOUND_S
    assert result.content == REPLY and result.backend != home.url


# ---------------------------------------------------------------------------- kills


def test_no_turn_is_lost_when_a_backend_dies(config, stubs, stub_at) -> None:
    """Kill the session's backend between turns, during a call and during a stream: every
    turn completes (elsewhere), none is lost."""
    lost: dict[str, int] = {}
    for timing in ("between turns", "during a call", "during a stream"):
        for stub in stubs:
            stub.start()
            stub.reset()
        with AgentSpecClient(config) as client, client.session() as s:
            home, other = _settled(client, stub_at, s)
            attempted = len(s.turns) + 1
            if timing == "between turns":
                home.stop()
                s.chat(ASK)
            elif timing == "during a call":
                home.hang = True  # the request is in flight when the process dies
                killer = threading.Timer(0.2, home.stop)
                killer.start()
                s.chat(ASK)
                killer.join()  # the next round restarts it
            else:
                home.hang_stream_after = 2  # output delivered, then the process dies
                killer = threading.Timer(0.2, home.stop)
                killer.start()
                assert _text(list(s.stream_chat(ASK))) == REPLY
                killer.join()  # the next round restarts it
            lost[timing] = attempted - len(s.turns)
            assert s.turns[-1].backend == other
    print("\nFIGURE turns lost per kill timing:", lost)
    assert lost == {"between turns": 0, "during a call": 0, "during a stream": 0}


# ---------------------------------------------------------------------------- the machine


def _machine(**policy):
    from agentspec.client import BackendRouter, RetryPolicy

    router = BackendRouter(["http://a:1", "http://b:1"])
    return router, router.attempts("g", RetryPolicy(backoff_initial_s=0.0, backoff_max_s=0.0, **policy))


def _cut(attempt, *, resumable: bool) -> None:
    from agentspec.client import BackendUnavailableError

    attempt.output("echo:")
    attempt.received.token_ids.extend([1, 2])
    attempt.received.prompt_token_ids = [7]
    attempt.received.resumable = resumable
    with attempt:
        raise BackendUnavailableError(attempt.backend, "cut")


def test_machine_hands_a_resumable_cut_to_the_next_attempt() -> None:
    router, machine = _machine()
    first = machine.next_action()
    _cut(first, resumable=True)
    assert not router.is_up(first.backend)
    second = machine.next_action()
    assert second.backend != first.backend
    assert second.resume_from is not None and second.resume_from.token_ids == [1, 2]
    assert second.received.text == "echo:" and second.received.prompt_token_ids == [7]
    second.output(" more")
    second.received.token_ids.append(3)
    assert second.resume_from.token_ids == [
        1,
        2,
    ]  # a copy: the next resumption starts here
    with second:
        pass
    assert machine.delivered is second


@pytest.mark.parametrize("resumable, policy", [(False, {}), (True, {"resume_streams": False})])
def test_machine_stops_a_cut_it_cannot_resume(resumable, policy) -> None:
    _, machine = _machine(**policy)
    with pytest.raises(StreamInterruptedError) as info:
        _cut(machine.next_action(), resumable=resumable)
    assert info.value.received_text == "echo:"
    assert machine.done


def test_cut_after_the_whole_budget_only_closes_the_stream(config, stubs, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        home, other = _settled(client, stub_at, s)
        home.cut_stream_after = 2
        delivered = len(stub_tokenize("echo: one"))
        before = len(stub_at(other).generation_requests())
        stream = s.stream_chat(ASK, max_tokens=delivered)
        chunks = list(stream)
    assert _text(chunks) == "echo: one"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert stream.result is not None and stream.result.finish_reason == "length"
    assert len(stub_at(other).generation_requests()) == before  # nothing left to generate
