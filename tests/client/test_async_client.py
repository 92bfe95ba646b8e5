"""The async client against two stub servers over real HTTP."""

from __future__ import annotations

import anyio
import pytest

from agentspec.client import (
    AsyncAgentSpecClient,
    SessionClosedError,
    StreamInterruptedError,
)
from agentspec.testing.stub import stub_tokenize

USER = [{"role": "user", "content": "hello there"}]


async def test_fifty_concurrent_sessions(config, stubs) -> None:
    results: dict[str, list[str]] = {}

    async def agent(i: int) -> None:
        async with client.session(f"agent-{i}", group_id=f"task-{i % 10}") as s:
            for turn in range(3):
                r = await s.chat([{"role": "user", "content": f"{i}/{turn}"}])
                assert r.content == f"echo: {i}/{turn}"
            results[s.session_id] = [t.backend for t in s.turns]

    async with AsyncAgentSpecClient(config) as client:
        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(agent, i)
        assert client.loads() == {}  # every session closed
    assert len(results) == 50
    for backends in results.values():
        assert len(set(backends)) == 1
    # Sessions of one group land together.
    for g in range(10):
        assert len({results[f"agent-{i}"][0] for i in range(g, 50, 10)}) == 1
    assert {b for bs in results.values() for b in bs} == {s.url for s in stubs}


async def test_cancelling_one_session_leaves_the_others(config, stubs) -> None:
    for stub in stubs:
        stub.delay_s = 0.2
    done: list[str] = []
    async with AsyncAgentSpecClient(config) as client:

        async def run(s) -> None:
            r = await s.chat(USER)
            done.append(s.session_id)
            assert r.content == "echo: hello there"

        victim = client.session("victim")
        others = [client.session(f"other-{i}") for i in range(5)]
        victim_scope = anyio.CancelScope()

        async def cancellable() -> None:
            with victim_scope:
                await run(victim)

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancellable)
            for s in others:
                tg.start_soon(run, s)
            await anyio.sleep(0.05)
            victim_scope.cancel()
        assert sorted(done) == sorted(s.session_id for s in others)
        assert victim.turns == () and all(len(s.turns) == 1 for s in others)
        # Cancellation is not a failure: nothing was marked down, the victim still works.
        assert client.healthy_backends() == list(client.backends)
        for stub in stubs:
            stub.delay_s = 0.0
        assert (await victim.chat(USER)).content == "echo: hello there"
        assert len(victim.turns) == 1


async def test_async_stream_and_tokens(config) -> None:
    async with AsyncAgentSpecClient(config) as client, client.session() as s:
        async with s.stream_chat(USER) as stream:
            text = "".join([c["choices"][0]["delta"].get("content") or "" async for c in stream])
        assert text == "echo: hello there"
        assert stream.result is not None and stream.result.turn.streamed
        out = await s.complete_tokens([1, 2], max_tokens=2)
        assert out.token_ids == (3, 4)
        assert [t.kind for t in s.turns] == ["chat", "tokens"]


async def test_async_failover_and_stream_cut(config, stubs, stub_at) -> None:
    # Resuming turned off: a stream cut after output is lost, and says what was received.
    config = config.model_copy(update={"retry": config.retry.model_copy(update={"resume_streams": False})})
    async with AsyncAgentSpecClient(config) as client, client.session(group_id="ag") as s:
        await s.chat([{"role": "user", "content": "first"}])
        home = stub_at(s.backend)
        other = next(x for x in stubs if x is not home)
        home.cut_stream_after = 1
        with pytest.raises(StreamInterruptedError) as info:
            async for _ in s.stream_chat([{"role": "user", "content": "a b c"}]):
                pass
        assert info.value.received_text == "echo:"
        r = await s.chat([{"role": "user", "content": "second"}])
        assert r.backend == other.url
        seeds = other.generation_requests()[-1].body["agentspec_seeds"]
        assert seeds == [{"kind": "prior_turn", "scope": "session", "text": "first\necho: first"}]
        stats = await s.stats()
        assert stats.backend == other.url and stats.seeded_tokens == len(stub_tokenize("first\necho: first"))
        assert len(s.turns) == 2


async def test_async_retry_after_is_capped(config, stub_at) -> None:
    policy = config.retry.model_copy(update={"retry_after_max_s": 0.05})
    async with AsyncAgentSpecClient(config.model_copy(update={"retry": policy})) as client, client.session() as s:
        await s.chat(USER)
        home = stub_at(s.backend)
        home.fail_next(1, status=429, retry_after=3600)
        with anyio.fail_after(5):
            r = await s.chat(USER)
        assert r.backend == home.url and r.turn.attempts == 2


async def test_async_closed_session(config) -> None:
    async with AsyncAgentSpecClient(config) as client:
        s = client.session()
        await s.aclose()
        with pytest.raises(SessionClosedError):
            await s.chat(USER)
        with pytest.raises(SessionClosedError):
            s.stream_chat(USER)


async def test_async_background_health(stubs) -> None:
    async with AsyncAgentSpecClient(backends=[s.url for s in stubs], health_check_interval_s=0.05) as client:
        stubs[1].healthy = False
        with anyio.fail_after(5):
            while client.backend_states()[stubs[1].url].up:
                await anyio.sleep(0.02)
        stubs[1].healthy = True
        with anyio.fail_after(5):
            while not client.backend_states()[stubs[1].url].up:
                await anyio.sleep(0.02)


async def test_errors_inside_async_with_propagate_unchanged(stubs) -> None:
    with pytest.raises(KeyError):
        async with AsyncAgentSpecClient(backends=[s.url for s in stubs], health_check_interval_s=0.05):
            raise KeyError("boom")
