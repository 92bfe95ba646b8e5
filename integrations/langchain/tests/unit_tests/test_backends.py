"""Several backends: pinning per session/group, failure marking and failover (stub servers)."""

from __future__ import annotations

import httpx
import openai
import pytest

from agentspec.client import Failover, FailoverTransport
from agentspec.client.routing import rendezvous_order
from agentspec.testing.stub import StubServer
from langchain_agentspec import ChatAgentSpec


def is_backend_failure(exc: BaseException) -> bool:
    """openai's error for a backend that failed (no answer, or a 5xx), not a refused request."""
    if isinstance(exc, openai.APIConnectionError):
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500


def _pair_model(stubs: tuple[StubServer, StubServer], **kwargs: object) -> ChatAgentSpec:
    return ChatAgentSpec(
        model="tiny",
        backends=[stubs[0].url, stubs[1].url + "/v1"],
        max_retries=0,
        backend_cooldown_s=60.0,
        **kwargs,  # type: ignore[arg-type]
    )


def _by_url(stubs: tuple[StubServer, StubServer]) -> dict[str, StubServer]:
    return {s.url: s for s in stubs}


def _sessions_on(stub: StubServer) -> set[str]:
    return {r.session_id for r in stub.generation_requests() if r.session_id}


def test_every_call_of_a_session_reaches_its_pinned_backend(
    stubs: tuple[StubServer, StubServer],
) -> None:
    model = _pair_model(stubs)
    sessions = [f"sess-{i}" for i in range(8)]
    for _ in range(3):
        for sid in sessions:
            model.invoke("x", session_id=sid)
    a, b = stubs
    # No session is split, and with bounded load both backends take some.
    assert not (_sessions_on(a) & _sessions_on(b))
    assert _sessions_on(a) and _sessions_on(b)
    for sid in sessions:
        owner = _by_url(stubs)[model.backend_for(sid)]
        assert owner.sessions[sid].calls == 3
        assert model.session(sid).stats().calls == 3


def test_idle_pinning_follows_rendezvous_order(stubs: tuple[StubServer, StubServer]) -> None:
    """An idle group lands where agentspec's client would put it: same backend, same index."""
    model = _pair_model(stubs)
    model.invoke("x", session_id="first")
    assert model.backend_for("first") == rendezvous_order("first", [s.url for s in stubs])[0]


def test_group_keeps_its_sessions_together(stubs: tuple[StubServer, StubServer]) -> None:
    model = _pair_model(stubs)
    for i in range(6):
        model.invoke("x", session_id=f"member-{i}", group_id="task-1")
    owners = {model.backend_for(f"member-{i}") for i in range(6)}
    assert len(owners) == 1
    assert model.backend_for(group_id="task-1") in owners


def test_dead_backend_is_marked_and_the_session_moves(
    stubs: tuple[StubServer, StubServer],
) -> None:
    model = _pair_model(stubs)
    model.invoke("x", session_id="mover")
    first = model.backend_for("mover")
    dead = _by_url(stubs)[first]
    dead.stop()
    try:
        model.add_seed("pending seed", session_id="mover")
        reply = model.invoke("hello", session_id="mover")  # retried on the other backend
        assert reply.content == "echo: hello"
        second = model.backend_for("mover")
        assert second != first
        assert model.failover is not None
        assert model.failover.router.states()[first].up is False
        alive = _by_url(stubs)[second]
        # The retry carried the session's ids and its seeds to the new backend.
        last = alive.generation_requests()[-1]
        assert last.session_id == "mover"
        assert last.body["agentspec_seeds"][0]["text"] == "pending seed"
        model.invoke("again", session_id="mover")
        assert alive.sessions["mover"].calls == 2
    finally:
        dead.start()


def test_5xx_fails_over_but_4xx_does_not(stubs: tuple[StubServer, StubServer]) -> None:
    model = _pair_model(stubs)
    model.invoke("x", session_id="s5")
    home = _by_url(stubs)[model.backend_for("s5")]
    home.fail_next(1, status=503)
    model.invoke("y", session_id="s5")
    assert model.backend_for("s5") != home.url

    other = _by_url(stubs)[model.backend_for("s5")]
    other.fail_next(1, status=400)
    with pytest.raises(Exception) as info:
        model.invoke("z", session_id="s5")
    assert not is_backend_failure(info.value)
    assert model.backend_for("s5") == other.url


def test_stream_fails_over_before_the_first_chunk(stubs: tuple[StubServer, StubServer]) -> None:
    model = _pair_model(stubs)
    model.invoke("x", session_id="st")
    home = _by_url(stubs)[model.backend_for("st")]
    home.fail_next(1, status=500)
    text = "".join(str(c.content) for c in model.stream("streamed", session_id="st"))
    assert text == "echo: streamed"
    assert model.backend_for("st") != home.url


@pytest.mark.asyncio
async def test_async_failover(stubs: tuple[StubServer, StubServer]) -> None:
    model = _pair_model(stubs)
    await model.ainvoke("x", session_id="as")
    home = _by_url(stubs)[model.backend_for("as")]
    home.fail_next(1, status=502)
    reply = await model.ainvoke("async", session_id="as")
    assert reply.content == "echo: async"
    assert model.backend_for("as") != home.url
    chunks = [c async for c in model.astream("more", session_id="as")]
    assert "".join(str(c.content) for c in chunks) == "echo: more"


def test_all_backends_down_raises(stubs: tuple[StubServer, StubServer]) -> None:
    model = _pair_model(stubs)
    for stub in stubs:
        stub.fail_next(1, status=500)
    with pytest.raises(Exception) as info:
        model.invoke("x", session_id="doomed")
    assert is_backend_failure(info.value)


def test_stream_cut_after_output_reaches_the_caller_and_moves_the_next_call(
    stubs: tuple[StubServer, StubServer],
) -> None:
    """The transport's stated limit: a stream that broke after output is not retried (the
    caller would see its start twice); the backend is marked down, the next call moves."""
    model = _pair_model(stubs)
    model.invoke("x", session_id="cut")
    home = _by_url(stubs)[model.backend_for("cut")]
    home.cut_stream_after = 1
    model.add_seed("seed sent with the cut call", session_id="cut")
    received: list[str] = []
    with pytest.raises(Exception) as info:
        for chunk in model.stream("one two three", session_id="cut"):
            received.append(str(chunk.content))
    assert "".join(received) == "echo:"
    assert isinstance(info.value, openai.APIConnectionError)  # langchain-openai wraps the cut
    assert len(home.generation_requests()) == 2  # the cut call was sent once
    # The call reached the server, which took its seed: it is not sent again.
    assert model.pending_seeds("cut") == []
    assert model.invoke("again", session_id="cut").content == "echo: again"
    assert model.backend_for("cut") != home.url


def test_openai_retries_stack_on_failover(stubs: tuple[StubServer, StubServer]) -> None:
    """The transport's other stated limit: each of the SDK's tries fails over across all
    backends, so ``max_retries=1`` with two backends is four attempts."""
    model = ChatAgentSpec(model="tiny", backends=[s.url for s in stubs], max_retries=1, backend_cooldown_s=0.0)
    for stub in stubs:
        stub.fail_next(100, status=500)
    with pytest.raises(Exception) as info:
        model.invoke("x", session_id="stacked")
    assert is_backend_failure(info.value)
    assert [len(s.generation_requests()) for s in stubs] == [2, 2]


def test_models_given_one_failover_pin_alike(stubs: tuple[StubServer, StubServer]) -> None:
    failover = Failover([s.url for s in stubs], cooldown_s=60.0)
    planner = ChatAgentSpec(model="tiny", failover=failover, max_retries=0)
    coder = ChatAgentSpec(model="tiny", failover=failover, max_retries=0, temperature=0.0)
    assert planner.backends == coder.backends == [s.url for s in stubs]
    planner.invoke("plan", session_id="shared")
    home = _by_url(stubs)[planner.backend_for("shared")]
    home.stop()
    try:
        coder.invoke("code", session_id="shared")  # fails over, and the planner learns of it
        assert planner.backend_for("shared") == coder.backend_for("shared") != home.url
    finally:
        home.start()


def test_own_http_client_with_backends_needs_its_failover(stubs: tuple[StubServer, StubServer]) -> None:
    urls = [s.url for s in stubs]
    with pytest.raises(ValueError, match="pass failover= too"):
        ChatAgentSpec(model="tiny", backends=urls, http_client=httpx.Client())
    with pytest.raises(ValueError, match="different servers"):
        ChatAgentSpec(model="tiny", backends=urls[:1], failover=Failover(urls))
    failover = Failover(urls)
    own = httpx.Client(transport=FailoverTransport(failover))
    model = ChatAgentSpec(model="tiny", failover=failover, http_client=own, max_retries=0)
    model.invoke("x", session_id="own")
    assert failover.backend_for("own") == model.backend_for("own")
