"""agentspec's series on vLLM's own ``/metrics``.

The proposer's statistics live in snapshot files (:mod:`agentspec.engine.snapshots`); this
module turns them into Prometheus metric families and puts them where vLLM's ``/metrics``
handler collects from:

- one API server: a collector registered in ``prometheus_client``'s default registry,
  which is the one vLLM serves; it reads the snapshots at scrape time.
- several API servers (``--api-server-count`` > 1): vLLM runs Prometheus multiprocess
  mode, which serves only what the processes wrote into ``PROMETHEUS_MULTIPROC_DIR``
  (custom collectors are not consulted). :class:`MultiprocessFiles` writes the families
  there, in ``prometheus_client``'s own file format, under names no process of vLLM uses;
  the middleware rewrites them just before vLLM answers a scrape, whichever API server
  takes it.

Every series carries vLLM's labels, ``model_name`` (the served model name) and ``engine``
(the data-parallel rank whose proposer wrote the snapshot), so agentspec's series join
vLLM's on the same dashboards. :data:`SERIES` is the reference list (docs/metrics.md is
made from it).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.registry import Collector

from agentspec.engine.snapshots import SCHEMA_VERSION, SnapshotReader

__all__ = [
    "HISTOGRAM_BUCKETS",
    "LABELS",
    "SERIES",
    "MultiprocessFiles",
    "Series",
    "SnapshotCollector",
    "families",
    "install",
]

#: vLLM's labels, on every agentspec series.
LABELS = ("model_name", "engine")
#: Upper bounds of the per-draft histograms (tokens); a draft is at most
#: ``num_speculative_tokens`` long, so these cover every setting up to 64 exactly enough.
HISTOGRAM_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
#: Environment variable of Prometheus multiprocess mode (set by vLLM for several API servers).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

Kind = Literal["counter", "gauge", "histogram"]
#: Multiprocess file name prefixes by kind (gauges in ``max`` mode: no ``pid`` label).
_FILE_PREFIX = {"counter": "counter", "gauge": "gauge_max", "histogram": "histogram"}


@dataclass(frozen=True)
class Series:
    """One agentspec series: its exported name (counters without ``_total``), kind, help
    text, labels beyond :data:`LABELS`, and how to read its samples from one snapshot."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    read: Callable[[Mapping[str, Any]], Iterable[tuple[tuple[str, ...], Any]]]

    @property
    def exposed_name(self) -> str:
        """The name in ``/metrics`` (Prometheus adds ``_total`` to counters)."""
        return self.name + "_total" if self.kind == "counter" else self.name


def _value(section: str, key: str) -> Callable[[Mapping[str, Any]], list[tuple[tuple[str, ...], Any]]]:
    return lambda snap: [((), snap.get(section, {}).get(key, 0))]


def _by(section: str, key: str, values: tuple[str, ...] | None = None) -> Callable[..., Any]:
    def read(snap: Mapping[str, Any]) -> list[tuple[tuple[str, ...], Any]]:
        counts = snap.get(section, {}).get(key, {})
        keys = values if values is not None else sorted(counts)
        return [((k,), counts.get(k, 0)) for k in keys]

    return read


def _index_keys(keys: dict[str, str]) -> Callable[..., Any]:
    return lambda snap: [((label,), snap.get("index", {}).get(key, 0)) for label, key in keys.items()]


def _engine_keys(keys: dict[str, str]) -> Callable[..., Any]:
    return lambda snap: [((label,), snap.get("engine", {}).get(key, 0)) for label, key in keys.items()]


def _distribution(name: str) -> Callable[..., Any]:
    return lambda snap: [((), {int(v): n for v, n in snap.get("distributions", {}).get(name, {}).items()})]


_LEVEL = ("level",)
_PATH = ("path",)
_PATHS = ("suffix", "model", "none")


def _per_path(suffix: str) -> Callable[..., Any]:
    return lambda snap: [((p,), snap.get("engine", {}).get(f"{p}_{suffix}", 0)) for p in _PATHS]


#: Every agentspec series, in the order ``/metrics`` shows them.
SERIES: tuple[Series, ...] = (
    # Drafting, by the index level a draft came from (call, session, group, global).
    Series("agentspec_drafts", "counter", "Drafts proposed, by the index level they came from.", _LEVEL,
           _by("index", "drafts_by_level")),
    Series("agentspec_draft_tokens", "counter", "Draft tokens proposed, by level.", _LEVEL,
           _by("index", "drafted_tokens_by_level")),
    Series("agentspec_accepted_tokens", "counter", "Draft tokens the target model accepted, by level.", _LEVEL,
           _by("index", "accepted_tokens_by_level")),
    Series("agentspec_draft_length", "histogram",
           "Tokens per draft (zero when the index matched nothing), per request and step.", (),
           _distribution("draft_length")),
    Series("agentspec_accepted_tokens_per_draft", "histogram",
           "Draft tokens the target model accepted, per non-empty draft.", (),
           _distribution("accepted_tokens_per_draft")),
    # Hybrid drafting (--agentspec-drafter): by path, suffix (the index), model (the
    # draft model) or none (a step without a draft); the drafter's passes.
    Series("agentspec_path_drafts", "counter",
           "Drafts sent for verification, by path (suffix, model; none: steps without a draft).", _PATH,
           _per_path("drafts_total")),
    Series("agentspec_path_draft_tokens", "counter", "Draft tokens sent for verification, by path.", _PATH,
           _per_path("draft_tokens_total")),
    Series("agentspec_path_accepted_tokens", "counter", "Draft tokens the target model accepted, by path.", _PATH,
           _per_path("accepted_tokens_total")),
    Series("agentspec_drafter_runs", "counter", "Steps that ran the draft model's draft passes.", (),
           _value("engine", "drafter_runs_total")),
    Series("agentspec_drafter_runs_skipped", "counter",
           "Steps whose draft passes were skipped: every request took the index's draft.", (),
           _value("engine", "drafter_runs_skipped_total")),
    Series("agentspec_drafter_runs_unpaid", "counter",
           "Steps whose draft passes were skipped because they cost more than the drafts they add (cost budget).",
           (), _value("engine", "drafter_runs_unpaid_total")),
    Series("agentspec_drafter_seconds", "counter", "Time in the draft model (all its passes).", (),
           _value("engine", "drafter_seconds_total")),
    # The index.
    Series("agentspec_sessions", "gauge", "Sessions held by the draft index.", (), _value("index", "sessions")),
    Series("agentspec_groups", "gauge", "Groups held by the draft index.", (), _value("index", "groups")),
    Series("agentspec_active_calls", "gauge", "Requests the proposer is drafting for.", (),
           _value("index", "active_calls")),
    Series("agentspec_index_memory_bytes", "gauge", "Estimated memory of the draft index's suffix trees.", (),
           _value("index", "memory_bytes")),
    Series("agentspec_index_tokens", "gauge", "Tokens held by the index, by level.", _LEVEL,
           _index_keys({lvl: f"{lvl}_tokens" for lvl in ("session", "group", "global")})),
    Series("agentspec_evictions", "counter", "Evicted sessions and groups.", ("scope",),
           _index_keys({"session": "evicted_sessions", "group": "evicted_groups"})),
    Series("agentspec_evicted_tokens", "counter", "Tokens dropped by eviction.", (),
           _value("index", "evicted_tokens")),
    # Requests, seeds, policy versions, batch budget and the fleet exchange.
    Series("agentspec_calls_started", "counter", "Requests the proposer started drafting for.", (),
           _value("engine", "calls_started_total")),
    Series("agentspec_calls_finished", "counter", "Requests released (finished or aborted) as vLLM reported them.",
           (), _value("engine", "calls_finished_total")),
    Series("agentspec_index_new_tokens", "counter",
           "Prompt tokens indexed at call start (new to the session's stream).", (),
           _value("engine", "index_new_tokens_total")),
    Series("agentspec_index_reused_tokens", "counter",
           "Prompt tokens already indexed by the session, not indexed again.", (),
           _value("engine", "index_reused_tokens_total")),
    Series("agentspec_seeded_tokens", "counter", "Tokens seeded into sessions and groups from requests.", (),
           _value("engine", "seeded_tokens_total")),
    Series("agentspec_seed_errors", "counter", "Seeds refused by the index (over its limits).", (),
           _value("engine", "seed_errors_total")),
    Series("agentspec_seed_only_requests", "counter", "Seed-only requests (POST /agentspec/v1/seeds) applied.", (),
           _value("engine", "seed_only_requests_total")),
    Series("agentspec_unadmitted_requests", "counter",
           "Requests that reached the engine without passing agentspec's middleware (run without agentspec).", (),
           _value("engine", "unadmitted_requests_total")),
    Series("agentspec_policy_updates", "counter", "New policy versions announced (POST /agentspec/v1/policy).", (),
           _value("engine", "policy_updates_total")),
    Series("agentspec_retired_output_tokens", "counter",
           "Output tokens retired from group and global drafting by policy updates.", (),
           _value("engine", "retired_output_tokens_total")),
    Series("agentspec_policy_version", "gauge", "The live policy version (RL weight updates).", (),
           _value("engine", "policy_version")),
    Series("agentspec_budget_limited_steps", "counter",
           "Draft steps whose budget the batch size cut below the maximum.", (),
           _value("engine", "budget_limited_steps_total")),
    Series("agentspec_budget_off_steps", "counter", "Draft steps with drafting switched off by the batch size.", (),
           _value("engine", "budget_off_steps_total")),
    Series("agentspec_draft_budget", "gauge", "Draft budget (tokens per request) of the latest step.", (),
           _value("engine", "draft_budget")),
    Series("agentspec_draft_min_prob", "gauge",
           "Path probability below which the latest step's drafts stopped (the budget's cut; 0: none).", (),
           _value("engine", "draft_min_prob")),
    Series("agentspec_draft_token_price", "gauge",
           "Output tokens one verified token cost in the latest step (cost budget): drafts stop below it.", (),
           _value("engine", "draft_token_price")),
    Series("agentspec_budget_cut_tokens", "counter",
           "Draft tokens the budget's probability cut took off (the tokens it gave up).", (),
           _value("engine", "budget_cut_tokens_total")),
    Series("agentspec_step_cost_fixed_seconds", "gauge", "Measured step cost: seconds every step pays.", (),
           _value("engine", "cost_fixed_seconds")),
    Series("agentspec_step_cost_request_seconds", "gauge",
           "Measured step cost: seconds each request in a step adds.", (),
           _value("engine", "cost_per_request_seconds")),
    Series("agentspec_step_cost_token_seconds", "gauge",
           "Measured step cost: seconds each verified token adds.", (),
           _value("engine", "cost_per_token_seconds")),
    Series("agentspec_step_cost_drafter_pass_seconds", "gauge",
           "Measured step cost: seconds each autoregressive pass of the model drafter adds.", (),
           _value("engine", "cost_drafter_pass_seconds")),
    Series("agentspec_step_cost_timed_steps", "gauge", "Decoding steps the measured step cost rests on.", (),
           _value("engine", "cost_timed_steps")),
    Series("agentspec_batch_size", "gauge", "Requests in the latest draft step.", (), _value("engine", "batch_size")),
    Series("agentspec_exchange_published", "counter",
           "Finished outputs published to the other replicas (corpus exchange).", (),
           _value("engine", "exchange_published_total")),
    Series("agentspec_exchange_received", "counter", "Outputs of other replicas indexed into the global corpus.", (),
           _value("engine", "exchange_received_total")),
    Series("agentspec_exchange_received_tokens", "counter",
           "Tokens of other replicas' outputs indexed into the global corpus.", (),
           _value("engine", "exchange_received_tokens_total")),
    Series("agentspec_exchange_retired", "counter",
           "Outputs of other replicas dropped: generated under a retired policy version.", (),
           _value("engine", "exchange_retired_total")),
    # The Redis transport's own (agentspec.engine.exchange.redis_streams); the folder has none.
    Series("agentspec_exchange_sent", "counter", "Published outputs Redis has taken (the stream's entries).", (),
           _value("engine", "exchange_sent_total")),
    Series("agentspec_exchange_read", "counter",
           "Other replicas' entries read from Redis and handed to the engine (its own earlier ones included).", (),
           _value("engine", "exchange_read_total")),
    Series("agentspec_exchange_restored", "counter",
           "This replica's own outputs of an earlier run, read back from Redis after a restart.", (),
           _value("engine", "exchange_restored_total")),
    Series("agentspec_exchange_skipped", "counter",
           "Entries not taken in, by reason: corrupt, foreign (another model), duplicate, expired.", ("reason",),
           _engine_keys({r: f"exchange_skipped_{r}_total" for r in ("corrupt", "foreign", "duplicate", "expired")})),
    Series("agentspec_exchange_dropped", "counter",
           "Outputs dropped by a full queue: outbound (Redis unreachable) or inbound (the engine behind).",
           ("direction",), _engine_keys({d: f"exchange_dropped_{d}_total" for d in ("outbound", "inbound")})),
    Series("agentspec_exchange_pending", "gauge", "Outputs queued for Redis, not yet taken.", (),
           _value("engine", "exchange_pending")),
    Series("agentspec_exchange_lag_seconds", "gauge",
           "Age of the latest entry read, from its publication to its reading.", (),
           _value("engine", "exchange_lag_seconds")),
    Series("agentspec_exchange_connected", "gauge", "Whether the replica reaches Redis (1) or drafts alone (0).", (),
           _value("engine", "exchange_connected")),
    Series("agentspec_exchange_outages", "counter", "Times the replica lost Redis.", (),
           _value("engine", "exchange_outages_total")),
)  # fmt: skip


def _histogram_buckets(counts: Mapping[int, int]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative ``(le, count)`` buckets and the sum, from exact counts per value."""
    buckets = []
    for bound in HISTOGRAM_BUCKETS:
        buckets.append((f"{float(bound)}", float(sum(n for v, n in counts.items() if v <= bound))))
    buckets.append(("+Inf", float(sum(counts.values()))))
    return buckets, float(sum(v * n for v, n in counts.items()))


def families(snapshots: Iterable[Mapping[str, Any]], model_name: str = "") -> list[Metric]:
    """The agentspec metric families of the proposers' snapshots, one sample set per
    snapshot labelled with its ``model_name`` and ``engine`` (``model_name`` is the
    fallback for snapshots that do not name theirs)."""
    snaps = [s for s in snapshots if s.get("schema") == SCHEMA_VERSION]
    out: list[Metric] = []
    for series in SERIES:
        labels = [*LABELS, *series.labels]
        family: Metric
        if series.kind == "counter":
            family = CounterMetricFamily(series.name, series.help, labels=labels)
        elif series.kind == "gauge":
            family = GaugeMetricFamily(series.name, series.help, labels=labels)
        else:
            family = HistogramMetricFamily(series.name, series.help, labels=labels)
        for snap in snaps:
            base = [str(snap.get("model_name") or model_name), str(snap.get("engine_index", "0"))]
            for extra, value in series.read(snap):
                if isinstance(family, HistogramMetricFamily):
                    buckets, total = _histogram_buckets(value)
                    family.add_metric([*base, *extra], buckets, total)
                else:
                    family.add_metric([*base, *extra], float(value or 0))
        out.append(family)
    return out


class SnapshotCollector(Collector):
    """A Prometheus collector of the proposers' snapshots, read at scrape time."""

    def __init__(self, reader: SnapshotReader) -> None:
        self.reader = reader

    def collect(self) -> Iterator[Metric]:
        yield from families(self.reader.snapshots())

    def describe(self) -> list[Metric]:
        # Names without samples, so a registry can check them without reading snapshots.
        return families(())


class MultiprocessFiles:
    """Writes metric families into a Prometheus multiprocess folder, as
    ``prometheus_client.multiprocess.MultiProcessCollector`` reads them.

    One file per kind, named ``<kind>_agentspec.db`` (vLLM's processes write
    ``<kind>_<pid>.db``); each is rewritten whole and moved into place, so a scrape in
    another process reads the previous or the next file, never half of one. Gauges use
    the ``max`` mode, which drops the ``pid`` label (there is one writer's file).
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    def write(self, metrics: Iterable[Metric]) -> None:
        by_kind: dict[str, list[Metric]] = {}
        for metric in metrics:
            by_kind.setdefault(metric.type, []).append(metric)
        # API servers answer scrapes concurrently: one rewrite at a time.
        with open(self.dir / ".agentspec.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for kind, prefix in _FILE_PREFIX.items():
                self._write_file(self.dir / f"{prefix}_agentspec.db", by_kind.get(kind, []))

    def _write_file(self, path: Path, metrics: list[Metric]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".agentspec-", suffix=".tmp")
        os.close(fd)
        os.unlink(tmp)  # MmapedDict initialises a missing file itself
        try:
            values = MmapedDict(tmp)
            try:
                for metric in metrics:
                    for sample in metric.samples:
                        labels = dict(sample.labels)
                        if metric.type == "histogram":
                            if sample.name.endswith("_count"):
                                continue  # the collector derives it from the buckets
                            if sample.name.endswith("_bucket"):
                                sample = sample._replace(value=_bucket_share(metric, sample))
                        key = mmap_key(
                            metric.name, sample.name, list(labels), list(labels.values()), metric.documentation
                        )
                        values.write_value(key, sample.value, 0.0)
            finally:
                values.close()
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _bucket_share(metric: Metric, sample: Any) -> float:
    """A cumulative bucket's count less the previous bucket's: multiprocess files hold
    per-bucket counts, and the collector accumulates them again."""
    labels = {k: v for k, v in sample.labels.items() if k != "le"}
    below = 0.0
    bound = float(sample.labels["le"])
    for other in metric.samples:
        if other.name != sample.name or {k: v for k, v in other.labels.items() if k != "le"} != labels:
            continue
        other_bound = float(other.labels["le"])
        if other_bound < bound:
            below = max(below, other.value)
    return sample.value - below


def install(reader: SnapshotReader, registry: CollectorRegistry | None = None) -> Callable[[], None] | None:
    """Puts agentspec's series where this API server's ``/metrics`` collects from.

    In multiprocess mode returns the refresh to run before each scrape; otherwise registers
    a :class:`SnapshotCollector` in ``registry`` (default: ``prometheus_client``'s, vLLM's
    own) and returns None.
    """
    directory = os.environ.get(MULTIPROC_ENV)
    if directory and registry is None:
        files = MultiprocessFiles(directory)
        return lambda: files.write(families(reader.snapshots()))
    target = REGISTRY if registry is None else registry
    try:
        target.register(SnapshotCollector(reader))
    except ValueError:
        # Already there: this process built its app twice (one registry per process).
        pass
    return None
