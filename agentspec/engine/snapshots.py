"""Statistics from the proposer (worker process) to the HTTP server (another process).

The proposer runs in vLLM's model-worker process, the OpenAI server in the API-server
process. The worker publishes a small JSON snapshot of its counters and per-session stats
into a folder (``EngineSettings.state_dir``), written atomically (temporary file, then
``os.replace``), so a reader sees either the previous or the next snapshot, never half of
one. The API server's middleware reads the snapshots to answer
``GET /agentspec/v1/sessions/{id}``, and :mod:`agentspec.engine.api_server.prometheus` turns them
into the ``agentspec_*`` series of vLLM's ``/metrics``. This works whatever process layout
vLLM picks (one or several API servers) and costs the worker nothing between snapshots.

One snapshot file per drafting worker (``proposer-dp<rank>.json``); readers merge them:
counters add up, a session is reported from the worker that holds it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentspec import wire

SNAPSHOT_GLOB = "proposer-*.json"
SCHEMA_VERSION = 3  # 2: sessions by tenant; 3: model name, engine index, distributions


def session_view(session_id: str, stats: dict[str, Any]) -> dict[str, Any]:
    """The wire form of one session's stats (docs/wire.md)."""
    return wire.session_stats_body(
        session_id,
        stats.get("group_id"),
        calls=int(stats.get("calls", 0)),
        draft_steps=int(stats.get("draft_steps", 0)),
        draft_tokens=int(stats.get("drafted_tokens", 0)),
        accepted_tokens=int(stats.get("accepted_tokens", 0)),
        indexed_tokens=int(stats.get("indexed_tokens", 0)),
        seeded_tokens=int(stats.get("seeded_tokens", 0)),
        last_index_new_tokens=int(stats.get("last_index_new_tokens", 0)),
        held_tokens=int(stats.get("held_tokens", 0)),
        accepted_tokens_by_level=_counts(stats.get("accepted_tokens_by_level")),
        seeded_tokens_by_kind=_counts(stats.get("seeded_tokens_by_kind")),
        policy_version=stats.get("policy_version"),
        draft_tokens_by_policy_version=_counts(stats.get("drafted_tokens_by_policy_version")),
        accepted_tokens_by_policy_version=_counts(stats.get("accepted_tokens_by_policy_version")),
        model_draft_steps=int(stats.get("model_draft_steps", 0)),
        model_draft_tokens=int(stats.get("model_drafted_tokens", 0)),
        model_accepted_tokens=int(stats.get("model_accepted_tokens", 0)),
    )


def _counts(by: dict[str, Any] | None) -> dict[str, int]:
    return {k: int(v) for k, v in (by or {}).items()}


class SnapshotWriter:
    """Writes the proposer's snapshot atomically into ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike[str], name: str) -> None:
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / name

    def write(self, snapshot: dict[str, Any]) -> None:
        data = json.dumps({"schema": SCHEMA_VERSION, "written_at": time.time(), **snapshot})
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@dataclass
class SnapshotReader:
    """Reads and caches the snapshots in ``state_dir`` (re-parsed only when a file changes)."""

    state_dir: Path
    _cache: dict[Path, tuple[int, dict[str, Any]]] = field(default_factory=dict)

    def snapshots(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(self.state_dir.glob(SNAPSHOT_GLOB)):
            try:
                mtime = path.stat().st_mtime_ns
                cached = self._cache.get(path)
                if cached is None or cached[0] != mtime:
                    cached = (mtime, json.loads(path.read_text()))
                    self._cache[path] = cached
                out.append(cached[1])
            except (OSError, ValueError):
                continue  # replaced between stat and read, or a foreign file: skip this round
        return out

    def session(self, session_id: str, tenant: str = "") -> dict[str, Any] | None:
        """The wire view of one of ``tenant``'s sessions, or ``None`` if no worker holds it."""
        for snap in self.snapshots():
            if snap.get("schema") != SCHEMA_VERSION:
                continue  # a worker of another version, still running: its layout differs
            stats = snap.get("sessions", {}).get(tenant, {}).get(session_id)
            if stats is not None:
                return session_view(session_id, stats)
        return None

    def summary(self) -> dict[str, Any]:
        """Server-wide totals over all workers (``GET /agentspec/v1/stats``)."""
        snaps = self.snapshots()
        return {
            "workers": len(snaps),
            "written_at": max((s.get("written_at", 0.0) for s in snaps), default=None),
            "engine": _sum_dicts(s.get("engine", {}) for s in snaps),
            "index": _sum_dicts(s.get("index", {}) for s in snaps),
        }


#: Per-worker values that do not add up over workers: the server-wide figure is the largest
#: (every worker takes the same policy update; the slowest replica's lag is the fleet's).
_NOT_SUMMED = frozenset({"policy_version", "exchange_lag_seconds"})


def _sum_dicts(dicts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for d in dicts:
        for key, value in d.items():
            if isinstance(value, dict):
                total[key] = _sum_dicts([total.get(key, {}), value])
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] = max(total.get(key, value), value) if key in _NOT_SUMMED else total.get(key, 0) + value
    return total
