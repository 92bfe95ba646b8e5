"""The folder transport of the corpus exchange: replicas on one machine (or on a shared
filesystem with append semantics) share their finished outputs through a folder.

Each replica (one drafting worker of one server) appends the outputs of its finished calls
to its own file ``<folder>/<name>.tok`` and reads the records the other replicas appended
to theirs, which the proposer puts into its global corpus. A file is a 32-byte header
(magic, format version, a random *generation* drawn whenever the writer starts the file
over, and 16 bytes standing for the writer's model fingerprint, see :mod:`.fingerprint`)
followed by records: a little-endian ``uint32`` length, then that many
little-endian ``int32`` values: the policy version the output was generated under (-1 for
none; RL weight updates, so that a replica drops outputs of retired policies), then its
tokens. Each record is written with one ``os.write`` on an
``O_APPEND`` descriptor, so a reader sees at worst an incomplete record at the end of a
file, which it leaves for its next poll.

Outputs stay within their tenant (see :mod:`agentspec.index`): a replica writes one file per
tenant, ``<name>~<tenant>.tok`` (``<name>.tok`` for the default tenant ``""``), and indexes a
peer's records into the global corpus of the tenant its file names. Tenant ids are derived
from API keys the same way on every replica (:func:`agentspec.engine.tenancy.tenant_for`), so
one key is one tenant across the fleet. :class:`TenantExchange` keeps one
:class:`CorpusExchange` per tenant.

Best effort, by design: a file over ``max_file_bytes`` is started over (truncated, with a
new generation; readers that had not read its end lose those records), a reader more
than ``max_backlog_bytes`` behind on a file (it started late, or its engine was idle)
keeps only that file's newest records, and a corrupt file is skipped until its writer
starts it over. A file of another model or tokenizer (another fingerprint), or of
another format version, is skipped as foreign. Skipped files are counted (once per file
and generation: ``exchange_skipped_corrupt_total``, ``exchange_skipped_foreign_total``).
Errors are logged, never raised: exchanging text must not take the engine down. Files of
stopped replicas stay (their text is still good for the same model) and may be deleted
at any time.

numpy and the standard library only; not thread-safe (the engine's thread owns it).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentspec.engine.exchange.base import TENANT_ID, PeerOutput
from agentspec.engine.exchange.fingerprint import model_digest

__all__ = ["HEADER_BYTES", "MAX_RECORD_TOKENS", "CorpusExchange", "TenantExchange", "tenant_of"]

logger = logging.getLogger("vllm.agentspec.exchange")

SUFFIX = ".tok"
TENANT_SEP = "~"
MAGIC = b"AGSX"
VERSION = 3  # 2: each record starts with its policy version; 3: the header carries the model
_HEADER = struct.Struct("<4sI8s16s")  # magic, version, generation, model digest
HEADER_BYTES = _HEADER.size
_LEN = struct.Struct("<I")
#: A record longer than this is taken for corruption.
MAX_RECORD_TOKENS = 1 << 24
_TOKENS = np.dtype("<i4")
_WARN_EVERY_S = 60.0
_NO_VERSION = -1
_MAX_VERSION = (1 << 31) - 1


@dataclass(slots=True)
class _Peer:
    """How far this reader got in one peer file."""

    ino: int
    generation: bytes
    offset: int = HEADER_BYTES
    corrupt: bool = False


class CorpusExchange:
    """One replica's end of the exchange: :meth:`publish` its outputs, :meth:`poll` the others'.

    ``name`` must be unique per process among everything that shares ``folder`` (the
    engine uses host, process id and data-parallel rank). It exchanges the outputs of one
    ``tenant`` only: it writes and reads that tenant's files, and only with replicas of
    the same ``model`` (fingerprint).
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        name: str,
        *,
        tenant: str = "",
        model: str = "",
        max_file_bytes: int = 64 << 20,
        max_read_bytes: int = 1 << 20,
        max_backlog_bytes: int = 4 << 20,
    ) -> None:
        if not TENANT_ID.fullmatch(tenant):
            raise ValueError(f"tenant ids in exchange file names are [A-Za-z0-9._-]*, got {tenant!r}")
        self.folder = Path(folder)
        self.tenant = tenant
        self.model_digest = model_digest(model)
        self.name = re.sub(r"[^A-Za-z0-9._-]", "_", name) + (TENANT_SEP + tenant if tenant else "") + SUFFIX
        self.path = self.folder / self.name
        #: Own file size after which it is started over.
        self.max_file_bytes = max_file_bytes
        #: Bytes one :meth:`poll` reads at most (at least one record), so that a poll costs
        #: the engine a bounded time; the rest waits for the next poll.
        self.max_read_bytes = max_read_bytes
        #: A reader further behind than this on a file skips to the newest records.
        self.max_backlog_bytes = max_backlog_bytes
        self._fd: int | None = None
        self._size = 0
        self._peers: dict[str, _Peer] = {}
        self._turn = 0  # which peer file a poll reads first, so none starves the others
        self._warned: dict[str, float] = {}
        self._counts: dict[str, float] = {}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self._warn("folder", "cannot create exchange folder %s: %s", self.folder, exc)

    # ------------------------------------------------------------------ writing

    def publish(self, tokens: np.ndarray, policy_version: int | None = None) -> bool:
        """Append one output, generated under ``policy_version``, to this replica's file.
        Returns whether it was written."""
        arr = np.asarray(tokens).reshape(-1)
        if not len(arr) or len(arr) >= MAX_RECORD_TOKENS:
            return False
        version = _NO_VERSION if policy_version is None else min(max(policy_version, 0), _MAX_VERSION)
        data = _LEN.pack(len(arr) + 1) + _LEN.pack(version & 0xFFFFFFFF) + arr.astype(_TOKENS, copy=False).tobytes()
        try:
            if self._fd is None:
                self._start_file()
            elif self._size + len(data) > self.max_file_bytes and self._size > HEADER_BYTES:
                self.close()
                self._start_file()
            assert self._fd is not None
            written = os.write(self._fd, data)
            self._size += written
            if written != len(data):
                raise OSError(f"short write ({written} of {len(data)} bytes)")
        except OSError as exc:
            # The file may now end in a torn record: start it over at the next publish.
            self.close()
            self._warn("publish", "cannot publish to %s: %s", self.path, exc)
            return False
        return True

    def _start_file(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            header = _HEADER.pack(MAGIC, VERSION, os.urandom(8), self.model_digest)
            if os.write(fd, header) != len(header):
                raise OSError("short write of the file header")
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._size = fd, len(header)

    def close(self) -> None:
        """Close this replica's file (it stays for the others; publishing starts it over)."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    # ------------------------------------------------------------------ reading

    def poll(self) -> list[PeerOutput]:
        """The complete records other replicas appended since the last poll."""
        try:
            names = sorted(
                e.name
                for e in os.scandir(self.folder)
                if e.name.endswith(SUFFIX) and e.name != self.name and tenant_of(e.name) == self.tenant
            )
        except OSError as exc:
            self._warn("poll", "cannot list exchange folder %s: %s", self.folder, exc)
            return []
        for gone in self._peers.keys() - set(names):
            del self._peers[gone]
        out: list[PeerOutput] = []
        budget = self.max_read_bytes
        if names:
            self._turn = (self._turn + 1) % len(names)
        for name in names[self._turn :] + names[: self._turn]:
            if budget <= 0:
                break
            try:
                budget -= self._read_peer(name, budget, out)
            except OSError as exc:
                self._warn("poll", "cannot read %s: %s", self.folder / name, exc)
        return out

    def _read_peer(self, name: str, budget: int, out: list[PeerOutput]) -> int:
        """Append ``name``'s new records to ``out``; returns the bytes consumed."""
        fd = os.open(self.folder / name, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            header = os.pread(fd, HEADER_BYTES, 0)
            if len(header) < HEADER_BYTES:
                return 0  # being started; its header comes next
            peer = self._peers.get(name)
            if peer is None or peer.ino != st.st_ino or peer.generation != header or st.st_size < peer.offset:
                peer = self._peers[name] = _Peer(st.st_ino, header)
                peer.corrupt = self._refuse(name, header)
            if peer.corrupt or st.st_size == peer.offset:
                return 0
            buf = os.pread(fd, st.st_size - peer.offset, peer.offset)
            if len(buf) > self.max_backlog_bytes:
                buf = self._skip_backlog(name, peer, buf)
            records, corrupt = _scan(buf, budget)
            used = records[-1][0] + 4 + 4 * records[-1][1] if records else 0
            taken = [_record(buf, pos, n) for pos, n in records if n > 1]
            # A writer that started over while we read would have changed the header.
            if os.pread(fd, HEADER_BYTES, 0) != header:
                del self._peers[name]
                return 0
            out.extend(taken)
            peer.offset += used
            if corrupt:
                peer.corrupt = True
                self._add("exchange_skipped_corrupt_total")
                self._warn(f"corrupt:{name}", "skipping the rest of %s: corrupt record at byte %d", name, peer.offset)
            return used
        finally:
            os.close(fd)

    def _refuse(self, name: str, header: bytes) -> bool:
        """Whether a file whose header is ``header`` is to be skipped (counted and logged)."""
        magic, version, _, digest = _HEADER.unpack(header)
        if magic != MAGIC:
            self._add("exchange_skipped_corrupt_total")
            self._warn(f"format:{name}", "skipping %s: not an exchange file", name)
        elif version != VERSION:
            # Another agentspec's format: its model cannot be told, so it is not taken in.
            self._add("exchange_skipped_foreign_total")
            self._warn(f"format:{name}", "skipping %s: exchange format %d, not %d", name, version, VERSION)
        elif digest != self.model_digest:
            self._add("exchange_skipped_foreign_total")
            self._warn(f"format:{name}", "skipping %s: written by a replica of another model or tokenizer", name)
        else:
            return False
        return True

    def counters(self) -> dict[str, float]:
        """Files skipped, by reason (``exchange_skipped_<reason>_total``)."""
        return dict(self._counts)

    def _add(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def _skip_backlog(self, name: str, peer: _Peer, buf: bytes) -> bytes:
        """The newest records of ``buf`` that fit in ``max_backlog_bytes`` (at least one):
        text a corpus of bounded size would drop soon is not worth the engine's time."""
        records, _ = _scan(buf)
        if not records:
            return buf
        end = records[-1][0] + 4 + 4 * records[-1][1]
        fits = (i for i, (pos, _) in enumerate(records) if end - pos <= self.max_backlog_bytes)
        keep = next(fits, len(records) - 1)
        skip = records[keep][0]
        if keep:
            logger.info("%s: %d records behind, skipping the oldest %d", name, len(records), keep)
        peer.offset += skip
        return buf[skip:]

    def _warn(self, kind: str, msg: str, *args: object) -> None:
        """Log a warning, at most one per kind a minute (a failing folder fails every step)."""
        now = time.monotonic()
        if now - self._warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
            self._warned[kind] = now
            logger.warning(msg, *args)


def tenant_of(file_name: str) -> str:
    """The tenant whose outputs an exchange file holds."""
    stem = file_name.removesuffix(SUFFIX)
    return stem.rsplit(TENANT_SEP, 1)[1] if TENANT_SEP in stem else ""


class TenantExchange:
    """A replica's exchange for every tenant: one :class:`CorpusExchange` per tenant, made
    when the tenant first publishes here or first appears in a peer's file name."""

    def __init__(self, folder: str | os.PathLike[str], name: str, *, model: str = "", **limits: int) -> None:
        self.folder = Path(folder)
        self.name = name
        self.model = model
        self._limits = limits
        self._by_tenant: dict[str, CorpusExchange] = {}

    def _for(self, tenant: str) -> CorpusExchange:
        exchange = self._by_tenant.get(tenant)
        if exchange is None:
            exchange = self._by_tenant[tenant] = CorpusExchange(
                self.folder, self.name, tenant=tenant, model=self.model, **self._limits
            )
        return exchange

    def publish(
        self, tokens: np.ndarray, tenant: str = "", policy_version: int | None = None, group: str | None = None
    ) -> bool:
        """Append one output of ``tenant`` to this replica's file for that tenant (files
        carry no group)."""
        return self._for(tenant).publish(tokens, policy_version)

    def poll(self) -> list[tuple[str, PeerOutput]]:
        """``(tenant, output)`` of every record the other replicas appended since the last poll."""
        try:
            tenants = {tenant_of(e.name) for e in os.scandir(self.folder) if e.name.endswith(SUFFIX)}
        except OSError:
            tenants = set()
        out: list[tuple[str, PeerOutput]] = []
        for tenant in sorted(tenants | self._by_tenant.keys()):
            if TENANT_ID.fullmatch(tenant):
                out.extend((tenant, output) for output in self._for(tenant).poll())
        return out

    def counters(self) -> dict[str, float]:
        """The files its tenants' exchanges skipped, by reason (each file is one tenant's)."""
        out: dict[str, float] = {}
        for exchange in self._by_tenant.values():
            for key, n in exchange.counters().items():
                out[key] = out.get(key, 0) + n
        return out

    def close(self, timeout: float = 2.0) -> None:
        """Close its files (every record was written when published: nothing to flush)."""
        for exchange in self._by_tenant.values():
            exchange.close()


def _record(buf: bytes, pos: int, n: int) -> PeerOutput:
    """The record of ``n`` values at ``pos``: its policy version, then its tokens."""
    values = np.frombuffer(buf, _TOKENS, n, pos + 4)
    version = int(values[0])
    return PeerOutput(values[1:].astype(np.int32), None if version < 0 else version)


def _scan(buf: bytes, limit: int | None = None) -> tuple[list[tuple[int, int]], bool]:
    """The complete records at the start of ``buf`` as ``(position, tokens)``, as many as
    fit in ``limit`` bytes (at least one), and whether a corrupt length ended the scan (an
    incomplete last record does not: it is still being written)."""
    records: list[tuple[int, int]] = []
    pos, size = 0, len(buf)
    while pos + 4 <= size:
        (n,) = _LEN.unpack_from(buf, pos)
        if n > MAX_RECORD_TOKENS:
            return records, True
        end = pos + 4 + 4 * n
        if end > size or (limit is not None and records and end > limit):
            break
        records.append((pos, n))
        pos = end
    return records, False
