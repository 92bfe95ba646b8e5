"""A backend marked down cancels its requests in flight, which are retried elsewhere: a hung
backend (the stub's ``hang`` fault: no answer until released) costs a turn about as long as
the health check takes to notice, not the read timeout."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from agentspec.client import (
    AgentSpecClient,
    AsyncAgentSpecClient,
    BackendRouter,
    BackendUnavailableError,
    ClientConfig,
    RetryPolicy,
    StreamInterruptedError,
)

USER = [{"role": "user", "content": "hello there"}]
READ_TIMEOUT_S = 30.0
BOUND_S = 10.0  # functional bound: far below the read timeout, not a benchmark
MARK_DOWN_AFTER_S = 0.3


def _figure(name: str, elapsed: float) -> None:
    print(f"\nFIGURE turn after a hang, {name}: {elapsed:.2f} s (read timeout {READ_TIMEOUT_S:.0f} s)")


@pytest.fixture
def slow_config(config: ClientConfig) -> ClientConfig:
    return config.model_copy(update={"read_timeout_s": READ_TIMEOUT_S})


def _home(client, stub_at, s):
    """Run one turn so the session has a home backend; return (home stub, other url)."""
    s.chat(USER)
    home = stub_at(s.backend)
    other = next(b for b in client.backends if b != s.backend)
    return home, other


def _later(fn, delay: float = MARK_DOWN_AFTER_S) -> threading.Timer:
    timer = threading.Timer(delay, fn)
    timer.start()
    return timer


# ---------------------------------------------------------------------------- the router


def test_mark_down_calls_the_watchers_of_that_backend_only() -> None:
    router = BackendRouter(["http://a:1", "http://b:1"])
    seen: list[tuple[str, str]] = []
    ha = router.watch("http://a:1", lambda r: seen.append(("a", r)))
    router.watch("http://b:1", lambda r: seen.append(("b", r)))
    router.mark_down("http://a:1", "gone")
    assert seen == [("a", "gone")]
    router.unwatch(ha)
    router.unwatch(ha)  # idempotent
    router.mark_down("http://a:1", "again")
    assert seen == [("a", "gone")]
    assert router.watching("http://b:1") == 1


def test_a_failing_watcher_does_not_stop_the_others() -> None:
    router = BackendRouter(["http://a:1", "http://b:1"])
    seen: list[str] = []

    def bad(reason: str) -> None:
        raise RuntimeError("bug")

    router.watch("http://a:1", bad)
    router.watch("http://a:1", seen.append)
    router.mark_down("http://a:1", "gone")
    assert seen == ["gone"]
    assert not router.is_up("http://a:1")


def test_a_cancelled_attempt_is_retried_elsewhere_and_keeps_the_mark_down_reason() -> None:
    router = BackendRouter(["http://a:1", "http://b:1"])
    machine = router.attempts("g", RetryPolicy(backoff_initial_s=0.0, backoff_max_s=0.0))
    first = machine.next_action()
    cancelled: list[str] = []
    first.on_mark_down(cancelled.append)
    router.mark_down(first.backend, "/health answered 503")
    assert cancelled == ["/health answered 503"]
    with first:
        raise first.interrupted()
    assert router.states()[first.backend].last_error == "/health answered 503"
    assert router.watching(first.backend) == 0  # unwatched when the attempt ended
    second = machine.next_action()
    assert second.backend != first.backend
    with second:
        pass
    assert machine.delivered is second


def test_a_cancelled_attempt_after_output_is_an_interrupted_stream() -> None:
    router = BackendRouter(["http://a:1", "http://b:1"])
    machine = router.attempts("g")
    attempt = machine.next_action()
    attempt.on_mark_down(lambda r: None)
    attempt.output("partial")
    router.mark_down(attempt.backend, "gone")
    with pytest.raises(StreamInterruptedError) as info, attempt:
        raise attempt.interrupted()
    assert isinstance(info.value.__cause__, BackendUnavailableError)


# ---------------------------------------------------------------------------- sync


@pytest.mark.parametrize("how", ["health check", "another call's failure"])
def test_sync_hung_chat_moves_on_when_the_backend_is_marked_down(slow_config, stub_at, how) -> None:
    with AgentSpecClient(slow_config) as client, client.session() as s:
        home, other = _home(client, stub_at, s)
        home.hang = True
        if how == "health check":
            home.healthy = False
            timer = _later(client.check_health)
        else:
            timer = _later(lambda: client.mark_down(home.url, "503 on another call"))
        start = time.monotonic()
        r = s.chat(USER)
        elapsed = time.monotonic() - start
        timer.join()
        _figure(f"sync chat, mark-down by {how}", elapsed)
        assert elapsed < BOUND_S
        assert r.backend == other and s.backend == other
        assert r.content == "echo: hello there"
        assert [t.backend for t in s.turns] == [home.url, other]
        assert client.router.watching(home.url) == 0


def test_sync_hung_stream_before_output_moves_on(slow_config, stub_at) -> None:
    with AgentSpecClient(slow_config) as client, client.session() as s:
        home, other = _home(client, stub_at, s)
        home.hang = True
        home.healthy = False
        timer = _later(client.check_health)
        start = time.monotonic()
        result = s.stream_chat(USER).until_done()
        elapsed = time.monotonic() - start
        timer.join()
        _figure("sync stream before output, health check", elapsed)
        assert elapsed < BOUND_S
        assert result.backend == other and result.content == "echo: hello there"


def test_sync_background_health_thread_cancels_a_hung_call(config, stub_at) -> None:
    cfg = config.model_copy(update={"read_timeout_s": READ_TIMEOUT_S, "health_check_interval_s": 0.2})
    with AgentSpecClient(cfg) as client, client.session() as s:
        home, other = _home(client, stub_at, s)
        home.hang = True
        home.healthy = False
        start = time.monotonic()
        r = s.chat(USER)
        elapsed = time.monotonic() - start
        _figure("sync chat, background health thread (0.2 s)", elapsed)
        assert elapsed < BOUND_S
        assert r.backend == other


def test_sync_stream_closed_early_stops_its_worker(slow_config, stub_at) -> None:
    with AgentSpecClient(slow_config) as client, client.session() as s:
        home, _ = _home(client, stub_at, s)
        home.hang_stream_after = 1
        stream = s.stream_chat(USER)
        next(stream)  # the role chunk
        assert next(stream)["choices"][0]["delta"]["content"] == "echo:"
        stream.close()
        assert stream.result is None
        assert client.router.watching(home.url) == 0
        home.release()
        assert s.chat(USER).backend == home.url  # nothing was marked down


# ---------------------------------------------------------------------------- async


@pytest.mark.parametrize("how", ["health check", "another call's failure"])
async def test_async_hung_chat_moves_on_when_the_backend_is_marked_down(slow_config, stub_at, how) -> None:
    async with AsyncAgentSpecClient(slow_config) as client, client.session() as s:
        await s.chat(USER)
        home = stub_at(s.backend)
        other = next(b for b in client.backends if b != s.backend)
        home.hang = True

        async def mark_down() -> None:
            await anyio.sleep(MARK_DOWN_AFTER_S)
            if how == "health check":
                home.healthy = False
                await client.check_health()
            else:
                client.mark_down(home.url, "503 on another call")

        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(mark_down)
            r = await s.chat(USER)
        elapsed = time.monotonic() - start
        _figure(f"async chat, mark-down by {how}", elapsed)
        assert elapsed < BOUND_S
        assert r.backend == other and r.content == "echo: hello there"
        assert client.router.watching(home.url) == 0


async def test_async_hung_stream_before_output_moves_on(slow_config, stub_at) -> None:
    async with AsyncAgentSpecClient(slow_config) as client, client.session() as s:
        await s.chat(USER)
        home = stub_at(s.backend)
        home.hang = True
        home.healthy = False

        async def mark_down() -> None:
            await anyio.sleep(MARK_DOWN_AFTER_S)
            await client.check_health()

        start = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(mark_down)
            result = await s.stream_chat(USER).until_done()
        elapsed = time.monotonic() - start
        _figure("async stream before output, health check", elapsed)
        assert elapsed < BOUND_S
        assert result.backend != home.url and result.content == "echo: hello there"


async def test_async_mark_down_from_another_thread_cancels(slow_config, stub_at) -> None:
    async with AsyncAgentSpecClient(slow_config) as client, client.session() as s:
        await s.chat(USER)
        home = stub_at(s.backend)
        home.hang = True
        timer = _later(lambda: client.mark_down(home.url, "marked down by an operator"))
        start = time.monotonic()
        r = await s.chat(USER)
        timer.join()
        assert time.monotonic() - start < BOUND_S
        assert r.backend != home.url
