"""Several backends: pinning per session/group, failure marking and failover (stub servers)."""

from __future__ import annotations

import pytest

from agentspec.client.routing import rendezvous_order
from agentspec.testing.stub import StubServer
from langchain_agentspec import ChatAgentSpec
from langchain_agentspec._backends import is_backend_failure


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
        assert model._pool is not None
        assert model._pool.states()[first].up is False
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
