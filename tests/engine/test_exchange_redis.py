"""The corpus exchange over a real ``redis-server`` (no vLLM): delivery, deduplication,
tenants, bounds, corrupt and foreign entries, outages and restarts."""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

redis = pytest.importorskip("redis", reason="the Redis exchange needs redis-py (the redis extra)")

from agentspec.engine.exchange import (
    PeerOutput,
    RedisExchange,
    RedisExchangeConfig,
    close_at_exit,
)
from agentspec.testing.redis_server import NO_REDIS, RedisServer, redis_server_binary

pytestmark = pytest.mark.skipif(redis_server_binary() is None, reason=NO_REDIS)

MODEL = "tiny:512"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def replicas(server: RedisServer) -> Iterator[Callable[..., RedisExchange]]:
    made: list[RedisExchange] = []

    def make(replica_id: str, url: str | None = None, model: str = MODEL, **kw: Any) -> RedisExchange:
        ex = RedisExchange(RedisExchangeConfig.parse(url or server.url + "?stream=test"), replica_id, model, **kw)
        made.append(ex)
        return ex

    yield make
    for ex in made:
        ex.close(timeout=0.5)


def _toks(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def _collect(ex: RedisExchange, n: int, timeout: float = 10.0) -> list[tuple[str, PeerOutput]]:
    """Poll until ``n`` outputs came (or the time is up)."""
    got: list[tuple[str, PeerOutput]] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += ex.poll()
        time.sleep(0.02)
    return got


def _wait(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def _view(got: list[tuple[str, PeerOutput]]) -> list[tuple[str, list[int], int | None]]:
    return [(tenant, out.tokens.tolist(), out.policy_version) for tenant, out in got]


def test_outputs_reach_the_others_with_their_tenant_and_version_never_back(replicas) -> None:
    a, b, c = replicas("a"), replicas("b"), replicas("c")
    assert a.publish(_toks(1, 2, 3), "tenant-x", 4, "g1")
    assert a.publish(_toks(5), "", None)
    assert b.publish(_toks(9, 9))
    assert _view(_collect(b, 2)) == [("tenant-x", [1, 2, 3], 4), ("", [5], None)]
    # Each replica's outputs in its order; two replicas' in the order Redis took them.
    assert sorted(_view(_collect(c, 3))) == [("", [5], None), ("", [9, 9], None), ("tenant-x", [1, 2, 3], 4)]
    assert _view(_collect(a, 1)) == [("", [9, 9], None)]
    time.sleep(0.3)
    assert a.poll() == [] and b.poll() == []  # once each; never one's own
    assert a.wait_idle(5) and a.counters()["exchange_sent_total"] == 2
    assert c.counters()["exchange_read_total"] == 3 and c.counters()["exchange_connected"] == 1.0
    assert c.counters()["exchange_lag_seconds"] < 60


def test_tenant_ids_that_are_not_ids_are_refused(replicas) -> None:
    a = replicas("a")
    assert not a.publish(_toks(1), "a/b") and not a.publish(_toks(), "")


def test_a_restarted_replica_takes_in_the_retained_window_and_its_own_earlier_outputs(replicas) -> None:
    a, b = replicas("a"), replicas("b")
    a.publish(_toks(1, 1))
    b.publish(_toks(2, 2))
    assert a.wait_idle(5) and b.wait_idle(5)
    assert _view(_collect(a, 1)) == [("", [2, 2], None)] and _view(_collect(b, 1)) == [("", [1, 1], None)]
    a.close()
    # Same replica id, new process life (epoch): its index is empty, so its earlier
    # output is worth taking back, and it knows it as its own.
    again = replicas("a")
    got = _collect(again, 2)
    assert sorted(out.tokens.tolist() for _, out in got) == [[1, 1], [2, 2]]
    assert again.counters()["exchange_restored_total"] == 1
    again.publish(_toks(3, 3))
    assert _view(_collect(b, 1)) == [("", [3, 3], None)]
    time.sleep(0.3)
    assert again.poll() == []  # this life's output does not come back


def test_catch_up_reads_at_most_the_newest_window(server: RedisServer, replicas) -> None:
    a = replicas("a")
    for i in range(30):
        a.publish(_toks(i + 1))
    assert a.wait_idle(5)
    late = replicas("late", url=server.url + "?stream=test&catch_up_entries=10")
    got = _collect(late, 10)
    time.sleep(0.3)
    got += late.poll()
    assert [out.tokens.tolist() for _, out in got] == [[i] for i in range(21, 31)]


def test_corrupt_foreign_and_duplicate_entries_are_skipped_and_counted(server: RedisServer, replicas) -> None:
    b = replicas("b")
    raw = redis.Redis.from_url(server.url)
    good = {"r": "x", "e": "e1", "s": 1, "m": MODEL, "t": "", "g": "", "v": "", "k": _toks(7, 7).tobytes()}
    raw.xadd("test", good)
    raw.xadd("test", good)  # the same entry again (a writer's retry): a duplicate
    raw.xadd("test", {**good, "s": 2, "m": "other-model:999"})  # another model's
    raw.xadd("test", {**good, "s": 3, "k": b"abc"})  # not int32s
    raw.xadd("test", {"hello": "world"})  # not ours at all
    raw.xadd("test", {**good, "s": 4, "t": "../etc"})  # not a tenant id
    raw.xadd("test", {**good, "s": 5, "v": "seven"})
    raw.xadd("test", {**good, "s": 6, "k": _toks(8).tobytes()})
    got = _collect(b, 2)
    assert [out.tokens.tolist() for _, out in got] == [[7, 7], [8]]
    assert _wait(lambda: b.counters().get("exchange_skipped_corrupt_total") == 4)
    counts = b.counters()
    assert counts["exchange_skipped_foreign_total"] == 1 and counts["exchange_skipped_duplicate_total"] == 1


def test_replicas_of_another_model_use_another_stream(server: RedisServer, replicas) -> None:
    a = replicas("a", url=server.url)
    other = replicas("o", url=server.url, model="other:999")
    same = replicas("s", url=server.url)
    a.publish(_toks(4, 4))
    assert _view(_collect(same, 1)) == [("", [4, 4], None)]
    time.sleep(0.5)
    assert other.poll() == [] and "exchange_skipped_foreign_total" not in other.counters()
    assert a.stream == "agentspec:exchange:tiny:512" != other.stream


def test_the_stream_is_trimmed_to_its_bound(server: RedisServer, replicas) -> None:
    a = replicas("a", url=server.url + "?stream=test&max_entries=10")
    for i in range(1000):
        a.publish(_toks(i + 1))
    assert a.wait_idle(10)
    # MAXLEN ~ trims whole internal nodes (100 entries by default): "about" the bound.
    assert redis.Redis.from_url(server.url).xlen("test") <= 200


def test_a_consumer_that_never_polls_holds_back_no_producer(replicas) -> None:
    a, idle = replicas("a"), replicas("idle", max_inbound=5)
    for i in range(50):
        a.publish(_toks(i + 1))
    assert a.wait_idle(5) and a.counters()["exchange_sent_total"] == 50
    assert _wait(lambda: idle.counters().get("exchange_dropped_inbound_total") == 45)
    assert [out.tokens.tolist() for _, out in idle.poll()] == [[i] for i in range(46, 51)]  # the newest


def test_redis_down_at_start_then_up(server: RedisServer, replicas, caplog: pytest.LogCaptureFixture) -> None:
    server.stop()
    a, b = replicas("a", max_pending=3), replicas("b")
    for i in range(5):
        assert a.publish(_toks(i + 1))  # queued; the engine never waits
    assert a.counters()["exchange_dropped_outbound_total"] == 2
    assert _wait(lambda: a.counters().get("exchange_outages_total") == 1)
    assert a.counters()["exchange_connected"] == 0.0 and a.poll() == []
    server.start()
    assert [out.tokens.tolist() for _, out in _collect(b, 3)] == [[3], [4], [5]]  # the newest kept
    assert _wait(lambda: a.counters()["exchange_connected"] == 1.0)
    warnings = [r for r in caplog.records if "unreachable" in r.getMessage() and r.name.endswith("exchange")]
    assert len(warnings) == 2  # once per replica, not per retry


def test_redis_killed_and_restarted_mid_run(server: RedisServer, replicas) -> None:
    a, b = replicas("a"), replicas("b")
    a.publish(_toks(1))
    assert _view(_collect(b, 1)) == [("", [1], None)]
    server.stop()  # the data goes with it (no persistence)
    assert _wait(lambda: b.counters()["exchange_connected"] == 0.0)
    a.publish(_toks(2))  # while Redis is down
    server.start()
    a.publish(_toks(3))
    got = [out.tokens.tolist() for _, out in _collect(b, 2, timeout=20)]
    assert got == [[2], [3]]
    assert b.counters()["exchange_outages_total"] == 1 and _wait(lambda: b.counters()["exchange_connected"] == 1.0)


def test_entries_older_than_max_age_are_skipped_counted_and_trimmed(server: RedisServer, replicas) -> None:
    raw = redis.Redis.from_url(server.url)
    # Each entry its own stream node, so that approximate trimming ("~") is exact here.
    raw.config_set("stream-node-max-entries", 1)
    old_ms = int(time.time() * 1000) - 60_000
    entry = {"r": "x", "e": "e1", "m": MODEL, "t": "", "g": "", "v": ""}
    for seq in (1, 2):  # published a minute ago
        raw.xadd("test", {**entry, "s": seq, "k": _toks(seq).tobytes()}, id=f"{old_ms}-{seq}")
    raw.xadd("test", {**entry, "s": 3, "k": _toks(3).tobytes()})  # now
    url = server.url + "?stream=test&max_age_s=5"
    b = replicas("b", url=url)
    assert [out.tokens.tolist() for _, out in _collect(b, 1)] == [[3]]
    assert _wait(lambda: b.counters().get("exchange_skipped_expired_total") == 2)
    assert b.counters()["exchange_lag_seconds"] < 5
    # A publishing replica trims what is past the age from the stream.
    a = replicas("a", url=url)
    a.publish(_toks(4))
    assert a.wait_idle(5)
    assert _wait(lambda: [int(f[b"s"]) for _, f in raw.xrange("test")] == [3, 1])  # x's 3, then a's first


def test_close_sends_what_is_queued(server: RedisServer, replicas) -> None:
    raw = redis.Redis.from_url(server.url)
    a = replicas("a")
    raw.execute_command("CLIENT", "PAUSE", 1000, "WRITE")  # Redis takes no entry for a second
    for i in range(50):
        assert a.publish(_toks(i + 1))
    assert a.counters()["exchange_pending"] == 50
    started = time.monotonic()
    a.close(timeout=5)
    assert time.monotonic() - started < 5
    assert raw.xlen("test") == 50 and a.counters()["exchange_pending"] == 0


def test_close_is_bounded_when_redis_is_down(server: RedisServer, replicas, caplog: pytest.LogCaptureFixture) -> None:
    a = replicas("a", block_s=0.2)
    server.stop()
    for i in range(3):
        a.publish(_toks(i + 1))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="vllm.agentspec.exchange"):
        a.close(timeout=1)
    assert time.monotonic() - started < 1 + 0.2 + 1  # the bound, the reader's block, slack
    assert "3 outputs queued for Redis were not sent" in caplog.text


class _Owner:
    """Stands for the proposer that owns an exchange (weakly referenced)."""


def _publish_and_exit(url: str, n: int) -> None:
    """A forked engine process: publishes ``n`` outputs and leaves at once."""
    ex = RedisExchange(RedisExchangeConfig.parse(url), "child", MODEL)
    owner = _Owner()
    close_at_exit(owner, ex)
    for i in range(n):
        ex.publish(_toks(i + 1))
    _publish_and_exit.owner = owner  # type: ignore[attr-defined]  # alive until the process exits


def test_a_process_that_exits_sends_its_queue_first(server: RedisServer) -> None:
    # vLLM's engine core is a forked multiprocessing child: it leaves without atexit hooks.
    raw = redis.Redis.from_url(server.url)
    raw.execute_command("CLIENT", "PAUSE", 1000, "WRITE")  # the child exits with all 20 queued
    child = multiprocessing.get_context("fork").Process(
        target=_publish_and_exit, args=(server.url + "?stream=test", 20)
    )
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert raw.xlen("test") == 20
