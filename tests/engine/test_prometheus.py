"""agentspec's Prometheus series from proposer snapshots: labels, histograms, and the
multiprocess files vLLM's collector reads when it runs several API servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from agentspec.engine.api_server.prometheus import (
    SERIES,
    MultiprocessFiles,
    SnapshotCollector,
    families,
    install,
)
from agentspec.engine.snapshots import SCHEMA_VERSION, SnapshotReader, SnapshotWriter
from agentspec.testing.stats import metric_value


def _snapshot(engine: str, drafts: int, lengths: dict[str, int], accepted: dict[str, int]) -> dict[str, Any]:
    return {
        "model_name": "tiny",
        "engine_index": engine,
        "engine": {"calls_started_total": drafts, "batch_size": 3, "policy_version": 7},
        "distributions": {"draft_length": lengths, "accepted_tokens_per_draft": accepted},
        "index": {
            "drafts_by_level": {"session": drafts, "global": 1},
            "drafted_tokens_by_level": {"session": 10 * drafts},
            "accepted_tokens_by_level": {"session": 4 * drafts},
            "session_tokens": 100,
            "evicted_sessions": 2,
        },
        "sessions": {},
    }


@pytest.fixture()
def reader(tmp_path: Path) -> SnapshotReader:
    SnapshotWriter(tmp_path, "proposer-dp0.json").write(_snapshot("0", 5, {"0": 2, "3": 4, "40": 1}, {"1": 3, "3": 1}))
    SnapshotWriter(tmp_path, "proposer-dp1.json").write(_snapshot("1", 2, {"8": 2}, {"8": 2}))
    return SnapshotReader(tmp_path)


def _text(reader: SnapshotReader) -> str:
    registry = CollectorRegistry()
    assert install(reader, registry) is None
    return generate_latest(registry).decode()


def test_every_series_carries_vllms_labels_per_engine(reader: SnapshotReader) -> None:
    text = _text(reader)
    for series in SERIES:
        assert f"# TYPE {series.exposed_name} {series.kind}" in text
    assert metric_value(text, "agentspec_drafts_total", 'engine="0",level="session",model_name="tiny"') == 5
    assert metric_value(text, "agentspec_drafts_total", 'engine="1",level="session"') == 2
    assert metric_value(text, "agentspec_calls_started_total", 'engine="1"') == 2
    assert metric_value(text, "agentspec_policy_version", 'engine="0"') == 7
    assert metric_value(text, "agentspec_index_tokens", 'engine="0",level="session"') == 100
    assert metric_value(text, "agentspec_evictions_total", 'engine="1",scope="session"') == 2
    # A series a snapshot has no value for is there, at zero, so dashboards find it.
    assert metric_value(text, "agentspec_exchange_retired_total", 'engine="0"') == 0


def test_histograms_count_exact_values_into_cumulative_buckets(reader: SnapshotReader) -> None:
    text = _text(reader)
    labels = 'engine="0",model_name="tiny"'
    # draft lengths 0 (x2), 3 (x4), 40 (x1)
    assert metric_value(text, "agentspec_draft_length_bucket", labels + ',le="0.0"') == 2
    assert metric_value(text, "agentspec_draft_length_bucket", labels + ',le="2.0"') == 2
    assert metric_value(text, "agentspec_draft_length_bucket", labels + ',le="3.0"') == 6
    assert metric_value(text, "agentspec_draft_length_bucket", labels + ',le="32.0"') == 6
    assert metric_value(text, "agentspec_draft_length_bucket", labels + ',le="48.0"') == 7
    assert metric_value(text, "agentspec_draft_length_bucket", labels + ',le="+Inf"') == 7
    assert metric_value(text, "agentspec_draft_length_count", labels) == 7
    assert metric_value(text, "agentspec_draft_length_sum", labels) == 3 * 4 + 40
    assert metric_value(text, "agentspec_accepted_tokens_per_draft_sum", labels) == 3 + 3
    assert metric_value(text, "agentspec_accepted_tokens_per_draft_count", 'engine="1"') == 2


def test_multiprocess_files_read_back_as_the_collector_serves(reader: SnapshotReader, tmp_path: Path) -> None:
    folder = tmp_path / "prom"
    folder.mkdir()
    # A vLLM process's file, as prometheus_client writes it: it stays as it is.
    theirs = MmapedDict(str(folder / "counter_4242.db"))
    theirs.write_value(mmap_key("vllm:x", "vllm:x_total", [], [], "x"), 3.0, 0.0)
    theirs.close()
    MultiprocessFiles(folder).write(families(reader.snapshots()))
    assert sorted(p.name for p in folder.glob("*.db")) == [
        "counter_4242.db",
        "counter_agentspec.db",
        "gauge_max_agentspec.db",
        "histogram_agentspec.db",
    ]
    served = CollectorRegistry()
    MultiProcessCollector(served, path=str(folder))
    text = generate_latest(served).decode()
    assert metric_value(text, "vllm:x_total") == 3
    direct = _text(reader)
    samples = [line for line in direct.splitlines() if line and not line.startswith("#")]
    assert len(samples) > 100
    for line in samples:
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        assert metric_value(text, name, labels.rstrip("}")) == float(value), line
    # Rewriting replaces the files' values (snapshots are totals, not increments).
    MultiprocessFiles(folder).write(families(reader.snapshots()))
    again = CollectorRegistry()
    MultiProcessCollector(again, path=str(folder))
    assert metric_value(generate_latest(again).decode(), "agentspec_drafts_total", 'engine="0",level="session"') == 5


def test_snapshots_of_another_schema_are_not_served(tmp_path: Path) -> None:
    (tmp_path / "proposer-dp0.json").write_text('{"schema": 1, "engine": {"calls_started_total": 9}}')
    assert SCHEMA_VERSION != 1
    assert "agentspec_calls_started_total{" not in _text(SnapshotReader(tmp_path))


def test_a_process_registers_one_collector(reader: SnapshotReader) -> None:
    registry = CollectorRegistry()
    install(reader, registry)
    install(reader, registry)  # a second app in the same process
    assert generate_latest(registry).decode().count("# TYPE agentspec_drafts_total counter") == 1
    assert isinstance(next(iter(registry._collector_to_names)), SnapshotCollector)


def test_the_server_summary_adds_counters_but_not_the_policy_version(reader: SnapshotReader) -> None:
    """``GET /agentspec/v1/stats`` over two data-parallel workers: counts add up, while the
    policy version (the same update on every worker) stays the version."""
    summary = reader.summary()
    assert summary["workers"] == 2
    assert summary["engine"]["calls_started_total"] == 5 + 2
    assert summary["engine"]["batch_size"] == 3 + 3
    assert summary["engine"]["policy_version"] == 7
    assert summary["index"]["drafts_by_level"] == {"session": 7, "global": 2}
