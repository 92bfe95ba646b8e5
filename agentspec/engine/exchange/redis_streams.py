"""The Redis Streams transport of the corpus exchange: replicas on many machines share their
finished outputs through one stream of a Redis server the operator runs.

Each finished output is one stream entry (``XADD``) with these fields:

====  ==========================================================================
``r``  the publishing replica's stable id (kept across restarts, see docs/fleet.md)
``e``  the publishing process's epoch (random per start)
``s``  the entry's sequence number within its epoch (deduplication)
``m``  the model fingerprint: only replicas of one model and tokenizer exchange
``t``  the tenant (:mod:`agentspec.engine.tenancy`)
``g``  the group id (empty: none)
``v``  the policy version it was generated under (empty: none announced)
``k``  the tokens, little-endian ``int32``
====  ==========================================================================

The stream is bounded: ``XADD ... MAXLEN ~`` keeps about ``max_entries`` entries, and
``XTRIM ... MINID ~`` drops entries older than ``max_age_s``. A replica starts by reading
the retained window (at most ``catch_up_entries``), so a restarted replica with an empty
index takes in its peers' recent text and its own earlier outputs (same replica id, an
earlier epoch); it never takes back what it published in this life.

The network stays off the engine's thread: :meth:`RedisExchange.publish` appends to a
bounded outbound queue and :meth:`RedisExchange.poll` drains a bounded inbound one; a writer
thread sends (pipelined ``XADD``), a reader thread receives (blocking ``XREAD``). The two
never wait on each other, so a slow reader does not hold back publishing. Redis down at
start or mid-run: the replica drafts from its own text, logs once per outage, retries with
backoff, then sends what it queued meanwhile (the newest ``max_pending``) and reads on from
the last entry it saw (what the stream trimmed in between is lost: bounded catch-up). An
entry that does not parse, or comes from another model or tokenizer (another
fingerprint), is skipped and counted, and so is one older than ``max_age_s``.

:meth:`RedisExchange.close` (engine shutdown) sends what is still queued for a bounded
time; a process that is killed loses its queue.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from agentspec.engine.exchange.base import TENANT_ID, PeerOutput
from agentspec.engine.exchange_config import RedisExchangeConfig, redacted

__all__ = ["RedisExchange"]

logger = logging.getLogger("vllm.agentspec.exchange")

#: An output longer than this many tokens is not exchanged (nor taken in).
MAX_ENTRY_TOKENS = 1 << 22
_TOKENS = np.dtype("<i4")
#: (replica, epoch) pairs whose latest sequence number is remembered for deduplication.
_DEDUP_PUBLISHERS = 4096


def _id_ms(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])


def _id_key(entry_id: bytes | str) -> tuple[int, int]:
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq or 0)


class _Link:
    """The connection's state as both threads see it: an outage is logged once, when the
    first thread fails, and its end once, when both threads got through again."""

    SIDES = ("writer", "reader")

    def __init__(self, where: str, on_outage: Any) -> None:
        self.where = where
        self._on_outage = on_outage
        self._lock = threading.Lock()
        self._up = dict.fromkeys(self.SIDES, False)
        self._delay = dict.fromkeys(self.SIDES, 0.0)
        self._down_since: float | None = None

    @property
    def up(self) -> bool:
        return all(self._up.values())

    def side_up(self, side: str) -> bool:
        return self._up[side]

    def failed(self, side: str, exc: BaseException) -> float:
        """Note a failure of ``side``; returns how long it should wait before trying again."""
        with self._lock:
            self._up[side] = False
            if self._down_since is None:
                self._down_since = time.monotonic()
                self._on_outage()
                logger.warning(
                    "agentspec exchange: Redis at %s unreachable (%s); drafting from local text, retrying",
                    self.where,
                    exc,
                )
            self._delay[side] = min(5.0, max(0.2, self._delay[side] * 2))
            return self._delay[side]

    def ok(self, side: str) -> None:
        """Note a success of ``side``."""
        with self._lock:
            self._up[side], self._delay[side] = True, 0.0
            if self._down_since is not None and self.up:
                logger.warning(
                    "agentspec exchange: Redis at %s is back after %.1f s",
                    self.where,
                    time.monotonic() - self._down_since,
                )
                self._down_since = None


class RedisExchange:
    """One replica's end of the exchange over a Redis stream.

    Args:
        config: the server, stream and bounds.
        replica_id: this replica's stable id (the same after a restart).
        model: the model fingerprint; entries of other fingerprints are skipped.
        max_pending: outputs queued for sending at most (the oldest are dropped beyond).
        max_inbound: received outputs waiting for the engine at most (the oldest are dropped).
        max_poll: outputs one :meth:`poll` hands to the engine at most.
        batch: entries one ``XADD`` pipeline or one ``XREAD`` carries at most.
        block_s: how long the reader's ``XREAD`` waits for new entries.
    """

    def __init__(
        self,
        config: RedisExchangeConfig,
        replica_id: str,
        model: str,
        *,
        max_pending: int = 10_000,
        max_inbound: int = 10_000,
        max_poll: int = 2_048,
        batch: int = 256,
        block_s: float = 0.5,
    ) -> None:
        import redis  # the exchange's optional dependency (the `redis` extra)

        if not replica_id:
            raise ValueError("a replica id must not be empty")
        self.config = config
        self.replica_id = replica_id
        self.model = model
        self.stream = config.stream_for(model)
        self.epoch = os.urandom(6).hex()
        self.max_pending, self.max_inbound, self.max_poll = max_pending, max_inbound, max_poll
        self.batch, self.block_s = batch, block_s
        self._errors = (redis.RedisError, OSError)
        # Any: redis-py types its replies for sync and async clients at once.
        self._client: Any = redis.Redis.from_url(
            config.url, socket_connect_timeout=2.0, socket_timeout=block_s + 5.0, health_check_interval=0
        )
        self._seq = 0
        self._lock = threading.Lock()  # guards the queues and the counters
        self._outbound: deque[tuple[int, dict[str, Any]]] = deque()
        self._inbound: deque[tuple[str, PeerOutput]] = deque()
        self._counts: dict[str, float] = {}
        self._last_id: bytes | None = None  # None: read the retained window first
        self._lag_s = 0.0
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush_until = float("inf")  # set by close(): the writer gives up sending then
        where = redacted(config.url)
        self._link = _Link(where, lambda: self._locked_add("exchange_outages_total"))
        self._threads = [
            threading.Thread(target=self._write_loop, name="agentspec-exchange-writer", daemon=True),
            threading.Thread(target=self._read_loop, name="agentspec-exchange-reader", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ engine thread

    def publish(
        self, tokens: np.ndarray, tenant: str = "", policy_version: int | None = None, group: str | None = None
    ) -> bool:
        """Queue one output for sending; never blocks. Returns whether it was queued."""
        arr = np.asarray(tokens).reshape(-1)
        if not len(arr) or len(arr) > MAX_ENTRY_TOKENS or not TENANT_ID.fullmatch(tenant):
            return False
        self._seq += 1
        fields = {
            "r": self.replica_id,
            "e": self.epoch,
            "s": self._seq,
            "m": self.model,
            "t": tenant,
            "g": group or "",
            "v": "" if policy_version is None else str(int(policy_version)),
            "k": arr.astype(_TOKENS, copy=False).tobytes(),
        }
        with self._lock:
            if len(self._outbound) >= self.max_pending:
                self._outbound.popleft()
                self._add("exchange_dropped_outbound_total")
            self._outbound.append((self._seq, fields))
        self._wake.set()
        return True

    def poll(self) -> list[tuple[str, PeerOutput]]:
        """The peers' outputs received since the last poll, at most ``max_poll``."""
        with self._lock:
            n = min(len(self._inbound), self.max_poll)
            return [self._inbound.popleft() for _ in range(n)]

    def counters(self) -> dict[str, float]:
        with self._lock:
            out = dict(self._counts)
            out["exchange_pending"] = len(self._outbound)
        out["exchange_connected"] = float(self._link.up)
        out["exchange_lag_seconds"] = self._lag_s
        return out

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued, for ``timeout`` seconds at most (giving up at once if
        Redis is down), then stop the threads and disconnect. Idempotent."""
        if self._stop.is_set():
            return
        deadline = time.monotonic() + timeout
        self._flush_until = deadline
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            # A reader in XREAD returns within block_s; a writer stuck in a send past
            # the deadline is a daemon thread and does not hold the process.
            thread.join(timeout=max(0.0, deadline - time.monotonic()) + self.block_s)
        with self._lock:
            unsent = len(self._outbound)
        if unsent:
            logger.warning("agentspec exchange: %d outputs queued for Redis were not sent before closing", unsent)
        try:
            self._client.close()
        except self._errors:
            pass

    def wait_idle(self, timeout: float) -> bool:
        """Wait until everything queued was sent (tests, shutdown). Returns whether it was."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._outbound:
                    return True
            time.sleep(0.01)
        return False

    # ------------------------------------------------------------------ writer thread

    def _write_loop(self) -> None:
        next_trim = 0.0
        while True:
            stopping = self._stop.is_set()
            if stopping and time.monotonic() >= self._flush_until:
                return
            with self._lock:
                batch = [item for _, item in zip(range(self.batch), self._outbound, strict=False)]
            if not batch:
                if stopping:
                    return
                if not self._link.side_up("writer"):
                    # Nothing to send, but whether Redis takes entries is still worth knowing.
                    try:
                        self._client.ping()
                    except self._errors as exc:
                        self._stop.wait(self._link.failed("writer", exc))
                        continue
                    self._link.ok("writer")
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                pipe = self._client.pipeline(transaction=False)
                for _, fields in batch:
                    pipe.xadd(self.stream, fields, maxlen=self.config.max_entries, approximate=True)
                pipe.execute()
                if time.monotonic() >= next_trim:
                    cutoff_ms = int((time.time() - self.config.max_age_s) * 1000)
                    self._client.xtrim(self.stream, minid=f"{max(cutoff_ms, 0)}-0", approximate=True)
                    next_trim = time.monotonic() + 10.0
            except self._errors as exc:
                if stopping:
                    return  # nothing more to be done for the queue
                self._stop.wait(self._link.failed("writer", exc))
                continue
            self._link.ok("writer")
            last = batch[-1][0]
            with self._lock:
                # The engine may have dropped items from the front meanwhile: pop by number.
                while self._outbound and self._outbound[0][0] <= last:
                    self._outbound.popleft()
                self._add("exchange_sent_total", len(batch))

    # ------------------------------------------------------------------ reader thread

    def _read_loop(self) -> None:
        resume = True
        while not self._stop.is_set():
            try:
                if resume:
                    self._last_id = self._start_id()
                    resume = False
                reply = self._client.xread(
                    {self.stream: self._last_id}, count=self.batch, block=int(self.block_s * 1000)
                )
            except self._errors as exc:
                resume = True
                self._stop.wait(self._link.failed("reader", exc))
                continue
            self._link.ok("reader")
            for _stream, entries in reply or ():
                for entry_id, fields in entries:
                    self._last_id = entry_id
                    self._take(entry_id, fields)

    def _start_id(self) -> bytes:
        """Where reading (re)starts: after the last entry seen, or the retained window's
        newest ``catch_up_entries`` at first (or when the stream was started over)."""
        import redis

        try:
            info = self._client.xinfo_stream(self.stream)
        except redis.ResponseError:
            return self._last_id or b"0-0"  # no stream yet: everything to come is new
        newest = info.get("last-generated-id") or b"0-0"
        if self._last_id is not None:
            if _id_key(self._last_id) <= _id_key(newest):
                return self._last_id
            logger.warning("agentspec exchange: stream %s was started over; reading its retained window", self.stream)
        if int(info.get("length", 0)) <= self.config.catch_up_entries:
            return b"0-0"
        window = self._client.xrevrange(self.stream, count=self.config.catch_up_entries + 1)
        return window[-1][0] if window else b"0-0"

    def _take(self, entry_id: bytes, fields: dict[bytes, bytes]) -> None:
        """Check one entry and queue it for the engine, or count why not."""
        try:
            replica, epoch = fields[b"r"].decode(), fields[b"e"].decode()
            seq, model, tenant = int(fields[b"s"]), fields[b"m"].decode(), fields[b"t"].decode()
            raw_version, data = fields[b"v"], fields[b"k"]
            version = int(raw_version) if raw_version else None
        except (KeyError, ValueError, UnicodeDecodeError):
            return self._skip("corrupt")
        if model != self.model:
            return self._skip("foreign")
        if not TENANT_ID.fullmatch(tenant) or not data or len(data) % 4 or len(data) // 4 > MAX_ENTRY_TOKENS:
            return self._skip("corrupt")
        if replica == self.replica_id and epoch == self.epoch:
            return None  # this life's own output: already in the index
        key = (replica, epoch)
        if seq <= self._seen.get(key, 0):
            return self._skip("duplicate")
        self._seen[key] = seq
        self._seen.move_to_end(key)
        if len(self._seen) > _DEDUP_PUBLISHERS:
            self._seen.popitem(last=False)
        age_s = max(0.0, time.time() - _id_ms(entry_id) / 1000)
        if age_s > self.config.max_age_s:
            return self._skip("expired")
        self._lag_s = age_s
        output = PeerOutput(np.frombuffer(data, _TOKENS).astype(np.int32), version)
        with self._lock:
            if len(self._inbound) >= self.max_inbound:
                self._inbound.popleft()
                self._add("exchange_dropped_inbound_total")
            self._inbound.append((tenant, output))
            self._add("exchange_read_total")
            if replica == self.replica_id:
                self._add("exchange_restored_total")
        return None

    def _skip(self, reason: str) -> None:
        self._locked_add(f"exchange_skipped_{reason}_total")

    def _locked_add(self, key: str) -> None:
        with self._lock:
            self._add(key)

    def _add(self, key: str, n: float = 1) -> None:
        self._counts[key] = self._counts.get(key, 0) + n
