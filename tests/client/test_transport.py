"""The failover transport under the OpenAI SDK, against two stub servers (real HTTP).

Besides pinning and failover these tests pin down the transport's stated limits: a stream
that breaks after its headers is not moved (the caller sees the error, the backend is
marked down, the session's next request goes elsewhere), and the SDK's ``max_retries``
stacks on top of failover, ``(max_retries + 1) * backends`` attempts at most.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest

from agentspec import wire
from agentspec.client import AsyncFailoverTransport, Failover, FailoverTransport
from agentspec.client.routing import rendezvous_order
from agentspec.testing.stub import StubServer


def _client(stubs: tuple[StubServer, StubServer], failover: Failover, *, max_retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stubs[0].url + "/v1",
        api_key="none",
        max_retries=max_retries,
        http_client=httpx.Client(transport=FailoverTransport(failover)),
    )


def _async_client(stubs: tuple[StubServer, StubServer], failover: Failover) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=stubs[1].url + "/v1",  # any backend's URL: the transport picks the target
        api_key="none",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=AsyncFailoverTransport(failover)),
    )


def _chat(client: openai.OpenAI, text: str, session: str | None = None, **kwargs: object) -> str:
    headers = {wire.SESSION_HEADER: session} if session else {}
    reply = client.chat.completions.create(
        model="stub-model",
        messages=[{"role": "user", "content": text}],
        extra_headers=headers,
        **kwargs,  # type: ignore[arg-type]
    )
    return str(reply.choices[0].message.content)


def _calls(stub: StubServer) -> int:
    return len(stub.generation_requests())


def test_requests_of_a_session_go_where_its_key_is_pinned(
    stubs: tuple[StubServer, StubServer], stub_at: Callable[[str | None], StubServer]
) -> None:
    failover = Failover([s.url for s in stubs])
    client = _client(stubs, failover)
    for sid in ("s1", "s2", "s3", "s4"):
        for _ in range(2):
            assert _chat(client, "hi", sid) == "echo: hi"
        home = stub_at(failover.backend_for(sid))
        assert home.sessions[sid].calls == 2
    # The first group, placed on idle backends, lands where agentspec's client puts it.
    assert failover.backend_for("s1") == rendezvous_order("s1", [s.url for s in stubs])[0]
    # The group header outranks the session: two sessions of one group share a backend.
    for sid in ("m1", "m2", "m3"):
        client.chat.completions.create(
            model="stub-model",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={wire.SESSION_HEADER: sid, wire.GROUP_HEADER: "task"},
        )
    assert len({failover.backend_for(sid) for sid in ("m1", "m2", "m3")}) == 1


def test_a_dead_backend_is_skipped_within_the_same_request(
    stubs: tuple[StubServer, StubServer], stub_at: Callable[[str | None], StubServer]
) -> None:
    failover = Failover([s.url for s in stubs], cooldown_s=60.0)
    client = _client(stubs, failover)
    _chat(client, "x", "mover")
    home = stub_at(failover.backend_for("mover"))
    home.stop()
    assert _chat(client, "moved", "mover") == "echo: moved"  # max_retries=0: failover did it
    other = failover.backend_for("mover")
    assert other != home.url
    assert failover.router.states()[home.url].up is False
    assert stub_at(other).sessions["mover"].calls == 1


def test_5xx_fails_over_but_4xx_and_429_reach_the_caller(
    stubs: tuple[StubServer, StubServer], stub_at: Callable[[str | None], StubServer]
) -> None:
    failover = Failover([s.url for s in stubs], cooldown_s=60.0)
    client = _client(stubs, failover)
    _chat(client, "x", "s5")
    home = stub_at(failover.backend_for("s5"))
    home.fail_next(1, status=503)
    _chat(client, "y", "s5")
    moved_to = stub_at(failover.backend_for("s5"))
    assert moved_to is not home

    moved_to.fail_next(1, status=400)
    with pytest.raises(openai.BadRequestError):
        _chat(client, "z", "s5")
    moved_to.fail_next(1, status=429, retry_after=0)
    with pytest.raises(openai.RateLimitError):
        _chat(client, "z", "s5")
    # Neither moved the session: the request, not the backend, was at fault.
    assert failover.backend_for("s5") == moved_to.url
    assert failover.router.states()[moved_to.url].up is True


def test_every_backend_5xx_returns_the_last_answer(stubs: tuple[StubServer, StubServer]) -> None:
    failover = Failover([s.url for s in stubs], cooldown_s=60.0)
    client = _client(stubs, failover)
    for stub in stubs:
        stub.fail_next(1, status=502)
    with pytest.raises(openai.InternalServerError) as info:
        _chat(client, "x", "doomed")
    assert info.value.status_code == 502
    assert [_calls(s) for s in stubs] == [1, 1]


@pytest.mark.parametrize("max_retries", [0, 2])
def test_sdk_retries_stack_on_failover(stubs: tuple[StubServer, StubServer], max_retries: int) -> None:
    """The stated limit: each of the SDK's tries fails over across every backend."""
    failover = Failover([s.url for s in stubs], cooldown_s=0.0)
    client = _client(stubs, failover, max_retries=max_retries)
    client = client.with_options(timeout=10.0)
    for stub in stubs:
        stub.fail_next(100, status=500)
    with pytest.raises(openai.InternalServerError):
        _chat(client, "x", "stacked")
    assert sum(_calls(s) for s in stubs) == (max_retries + 1) * len(stubs)
    assert [_calls(s) for s in stubs] == [max_retries + 1] * len(stubs)


def test_a_stream_cut_after_its_headers_is_not_moved(
    stubs: tuple[StubServer, StubServer], stub_at: Callable[[str | None], StubServer]
) -> None:
    """The stated limit: output may have reached the caller, so the error does too; the
    backend is marked down and the session's next request goes to the other one."""
    failover = Failover([s.url for s in stubs], cooldown_s=60.0)
    client = _client(stubs, failover)
    _chat(client, "x", "cut")
    home = stub_at(failover.backend_for("cut"))
    home.cut_stream_after = 1
    stream = client.chat.completions.create(
        model="stub-model",
        messages=[{"role": "user", "content": "one two three four"}],
        extra_headers={wire.SESSION_HEADER: "cut"},
        stream=True,
    )
    received: list[str] = []
    with pytest.raises((httpx.TransportError, openai.APIError)):
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
    assert received == ["echo:"]  # the part before the cut reached the caller, once
    assert _calls(home) == 2  # no second attempt of the cut request
    assert failover.router.states()[home.url].up is False
    assert _chat(client, "again", "cut") == "echo: again"
    assert failover.backend_for("cut") != home.url


def test_other_hosts_pass_through(stubs: tuple[StubServer, StubServer]) -> None:
    """A request to a URL that is none of the backends is sent as it is."""
    failover = Failover([stubs[0].url])
    with httpx.Client(transport=FailoverTransport(failover)) as http:
        assert http.get(stubs[1].url + "/health").status_code == 200
    assert failover.router.loads() == {}


async def test_async_transport_pins_and_fails_over(
    stubs: tuple[StubServer, StubServer], stub_at: Callable[[str | None], StubServer]
) -> None:
    failover = Failover([s.url for s in stubs], cooldown_s=60.0)
    client = _async_client(stubs, failover)
    headers = {wire.SESSION_HEADER: "as"}
    messages = [{"role": "user", "content": "async"}]
    reply = await client.chat.completions.create(model="stub-model", messages=messages, extra_headers=headers)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "echo: async"
    home = stub_at(failover.backend_for("as"))
    home.fail_next(1, status=500)
    stream = await client.chat.completions.create(
        model="stub-model",
        messages=messages,  # type: ignore[arg-type]
        extra_headers=headers,
        stream=True,
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "echo: async"
    assert failover.backend_for("as") != home.url
    await client.close()


def test_bad_backends_are_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        Failover(["gpu1:8000"])
    with pytest.raises(ValueError, match="at least one backend"):
        Failover([])
