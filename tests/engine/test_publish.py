"""The proposer's statistics snapshots stay off a busy engine's back.

In-process, without a server: the proposer gets a stand-in for vLLM's config (only the
speculative and model settings it reads) and a clock the test advances, so the throttle
rule is checked exactly rather than by timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import vllm_config_stand_in

from agentspec.engine.settings import EngineSettings

proposer_mod = pytest.importorskip("agentspec.engine.vllm.proposers", reason="needs vLLM")
from agentspec.engine.worker import drafting  # noqa: E402


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def _proposer(state_dir: Path):
    config = vllm_config_stand_in(8)
    settings = EngineSettings(state_dir=str(state_dir), publish_interval_s=0.2)
    return proposer_mod.AgentspecProposer(config, settings)  # type: ignore[arg-type]


def _timed_proposer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_cost_s: float):
    """A bound proposer on a test clock whose snapshots take ``write_cost_s`` to write;
    returns it, the clock and the list of times a snapshot was written."""
    clock = _Clock()
    monkeypatch.setattr(drafting, "time", clock)
    writes: list[float] = []
    real_write = drafting.SnapshotWriter.write

    def timed_write(self, snapshot):
        writes.append(clock.now)
        real_write(self, snapshot)
        clock.now += write_cost_s

    monkeypatch.setattr(drafting.SnapshotWriter, "write", timed_write)
    proposer = _proposer(tmp_path)
    proposer.bind(publish=True)  # the first snapshot, at t=0
    return proposer, clock, writes


def test_a_costly_snapshot_pushes_the_next_one_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proposer, clock, writes = _timed_proposer(tmp_path, monkeypatch, write_cost_s=0.05)
    assert writes == [0.0]
    snapshot = json.loads((tmp_path / "proposer-dp0.json").read_text())
    assert snapshot["index"]["sessions"] == 0

    # 20 x 0.05 s = 1 s until the next one, more than the 0.2 s interval.
    for t in (0.3, 0.6, 0.99):
        clock.now = t
        proposer._dirty = True
        proposer.publish()
    assert writes == [0.0]
    clock.now = 1.0
    proposer.publish()
    assert writes == [0.0, 1.0]
    # Going idle publishes at once, whatever the throttle says.
    proposer._dirty = True
    proposer.publish(force=True)
    assert writes == [0.0, 1.0, 1.05]


def test_cheap_snapshots_keep_the_configured_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proposer, clock, writes = _timed_proposer(tmp_path, monkeypatch, write_cost_s=0.0)
    for t in (0.1, 0.19, 0.2, 0.3, 0.45):
        clock.now = t
        proposer._dirty = True
        proposer.publish()
    assert writes == [0.0, 0.2, 0.45]


def test_a_release_on_the_last_step_reaches_the_idle_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step that releases the last call drafts nothing; its idle snapshot must still
    show the release, even when a busy snapshot was just written."""
    proposer, clock, writes = _timed_proposer(tmp_path, monkeypatch, write_cost_s=0.0)
    proposer.on_request_added("r1", None)
    clock.now = 0.5
    # What a step's propose does for a new request, then its busy snapshot.
    proposer.driver.begin("r1", list(range(8)))
    proposer._end_propose(None, 0, 0.0, 0)
    busy = json.loads((tmp_path / "proposer-dp0.json").read_text())
    assert busy["index"]["active_calls"] == 1
    assert busy["engine"]["calls_started_total"] == 1
    assert busy["engine"].get("calls_finished_total", 0) == 0

    clock.now = 0.51  # within the throttle interval: only going idle may write
    proposer.on_requests_finished(["r1"])
    proposer.on_step_end(idle=True)
    assert writes == [0.0, 0.5, 0.51]
    idle = json.loads((tmp_path / "proposer-dp0.json").read_text())
    assert idle["index"]["active_calls"] == 0
    assert idle["engine"]["calls_finished_total"] == 1
