"""Engines as Ray actors on a local Ray cluster (CPU), each running ``agentspec serve`` on
the tiny model: groups pinned to one engine, pinned groups drafting more than the same
groups spread, a weight update retiring the old policy's drafts (statistics by version),
and an engine killed mid-rollout costing no sample. Run apart from the main
suite (``-m ray``; scripts/test.sh does)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from agentspec import wire
from agentspec.engine.settings import EngineSettings
from agentspec.testing.pytest_plugin import TEST_INDEX_CONFIG
from agentspec.testing.server import TEST_SERVER_ARGS
from agentspec.testing.stats import metric_value, scrape, session_stats
from agentspec_rl import (
    EnvStep,
    RolloutClient,
    RolloutError,
    SampleState,
    SamplingParams,
)

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'agentspec-rl[ray]')")
# Lists the engines' processes (vLLM's dependency: there wherever the engines can run).
psutil = pytest.importorskip("psutil", reason="psutil is not installed (vLLM's dependency; install vLLM)")
from agentspec_rl.ray_pool import EnginePool

pytestmark = [pytest.mark.server, pytest.mark.ray]

PROMPTS = [[11 + i, 300 + 7 * i, 45, 1000 - i, 12, 7] for i in range(6)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _pool(model_dir: Path) -> EnginePool:
    # One CPU core per engine: two engines on one core run 2x slower.
    env = [{"VLLM_CPU_OMP_THREADS_BIND": str(i), "VLLM_CPU_KVCACHE_SPACE": "1"} for i in range(2)]
    return EnginePool(
        str(model_dir), 2, serve_args=TEST_SERVER_ARGS, settings=EngineSettings(index=TEST_INDEX_CONFIG), engine_env=env
    )


@pytest.fixture(scope="module")
def pool(cluster: None, tiny_model_dir: Path) -> Iterator[EnginePool]:
    """Two engines shared by the module's tests (the cluster has room for two), closed before
    the cluster goes; no process of theirs (server, engine core, worker) may outlive them."""
    engines = _pool(tiny_model_dir)
    try:
        # Listed while the servers run (a killed server's engine core could not be found later).
        servers = [psutil.Process(pid) for pid in ray.get([a.pid.remote() for a in engines.actors])]
        processes = [p for server in servers for p in (server, *server.children(recursive=True))]
        yield engines
    finally:
        engines.shutdown()
    _, alive = psutil.wait_procs(processes, timeout=5.0)
    assert not alive, "outlived the pool: " + "; ".join(f"{p.pid} {' '.join(p.cmdline())}" for p in alive)


def test_each_group_stays_on_one_engine(pool: EnginePool) -> None:
    with pool.client("tiny", max_concurrency=8) as rollouts:
        groups = rollouts.generate_many(PROMPTS, n=3, sampling=SamplingParams(max_tokens=8, seed=1))
        assert not any(isinstance(g, RolloutError) for g in groups)
        used = set()
        for group in groups:
            (engine,) = {s.backend for s in group.samples}
            used.add(engine)
            for s in group.samples:
                stats = session_stats(engine, s.session_id)
                assert stats is not None and stats["group_id"] == group.group_id
        assert used == set(pool.urls)  # bounded load: the groups were spread over both engines


def _accepted_total(engines: list[str]) -> float:
    """vLLM's own count of accepted draft tokens, all engines together, once it has settled
    (vLLM's counters follow the responses by a moment)."""

    def read() -> float:
        return sum(metric_value(scrape(e), "vllm:spec_decode_num_accepted_tokens_total") for e in engines)

    last = read()
    for _ in range(20):
        time.sleep(0.3)
        if (now := read()) == last:
            break
        last = now
    return last


def test_a_pinned_group_drafts_more_than_the_same_group_spread(pool: EnginePool) -> None:
    """The same four greedy samples of one prompt (identical outputs), one at a time: once
    as one group through the rollout client (one engine), once spread over both engines as a
    group-blind balancer would (each sample alone, alternating). Pinned, every sample after
    the first drafts its siblings' text; spread, a sample finds only the siblings that ran
    on its engine. Measured with vLLM's own spec-decode counters."""
    engines, greedy, tag = pool.urls, SamplingParams(max_tokens=40, temperature=0), uuid.uuid4().hex[:8]

    def arm(run: Callable[[], list[tuple[int, ...]]]) -> tuple[float, list[tuple[int, ...]]]:
        # A policy update first retires every earlier output, so both arms start alike.
        with pool.client("tiny") as client:
            client.on_weight_update(max(_live(e) for e in engines) + 1)
        before = _accepted_total(engines)
        outputs = run()
        return _accepted_total(engines) - before, outputs

    def pinned() -> list[tuple[int, ...]]:
        with pool.client("tiny", max_concurrency=1) as client:
            group = client.generate(PROMPTS[0], n=4, sampling=greedy, group_id=f"pin-{tag}")
        assert len({s.backend for s in group.samples}) == 1
        return [s.response_token_ids for s in group.samples]

    def spread() -> list[tuple[int, ...]]:
        outputs = []
        for i in range(4):
            with RolloutClient([engines[i % 2]], "tiny") as client:
                (sample,) = client.generate(PROMPTS[0], n=1, sampling=greedy, group_id=f"spread-{tag}-{i}").samples
            outputs.append(sample.response_token_ids)
        return outputs

    pinned_accepted, pinned_outputs = arm(pinned)
    spread_accepted, spread_outputs = arm(spread)
    assert pinned_outputs == spread_outputs  # the same work, token for token
    assert pinned_accepted > spread_accepted, (pinned_accepted, spread_accepted)


def _live(base: str) -> int:
    return int(httpx.get(base + wire.SERVER_STATS_PATH, timeout=10).json()["engine"].get("policy_version") or 0)


def test_a_weight_update_retires_the_old_policys_drafts_by_version(pool: EnginePool) -> None:
    """Greedy samples, one at a time, on one engine: an epoch under version v, then the same
    prompt under v+1 with v's outputs kept, then under v+2 with them retired. The sessions'
    statistics by version show which policy each ran under, and the kept epoch drafting more."""
    engine, greedy, tag = pool.urls[0], SamplingParams(max_tokens=40, temperature=0), uuid.uuid4().hex[:8]
    version = _live(engine) + 1
    with RolloutClient([engine], "tiny", max_concurrency=1) as client:
        client.on_weight_update(version)
        first = client.generate(PROMPTS[0], n=2, sampling=greedy, group_id=f"ep1-{tag}")
        client.on_weight_update(version + 1, keep_old_outputs=True)
        (kept,) = client.generate(PROMPTS[0], n=1, sampling=greedy, group_id=f"ep2-{tag}").samples
        retired_before = httpx.get(engine + wire.SERVER_STATS_PATH, timeout=10).json()["engine"][
            "retired_output_tokens_total"
        ]
        client.on_weight_update(version + 2)
        (fresh,) = client.generate(PROMPTS[0], n=1, sampling=greedy, group_id=f"ep3-{tag}").samples
    assert first.samples[1].policy_version == version and kept.policy_version == version + 1
    sibling, copy, alone = (session_stats(engine, s.session_id) for s in (first.samples[1], kept, fresh))
    assert sibling is not None and copy is not None and alone is not None
    # A sibling drafts the first sample's output (at the group or the global level: both hold it).
    by_level = sibling["accepted_tokens_by_level"]
    assert sibling["policy_version"] == version and by_level.get("group", 0) + by_level.get("global", 0) > 0
    assert sibling["accepted_tokens_by_policy_version"] == {str(version): sibling["accepted_tokens"]}
    # Kept: the previous version's outputs draft the new epoch (a copy of the same greedy text).
    assert copy["policy_version"] == version + 1
    assert copy["accepted_tokens_by_policy_version"] == {str(version + 1): copy["accepted_tokens"]}
    # Retired: nothing of the older versions drafts any more (nor the other engine's
    # exchanged outputs of them): the sample drafts only from what it writes itself.
    assert alone["policy_version"] == version + 2
    assert alone["accepted_tokens_by_policy_version"] == {str(version + 2): alone["accepted_tokens"]}
    assert alone["accepted_tokens"] < copy["accepted_tokens"]
    engine_stats = httpx.get(engine + wire.SERVER_STATS_PATH, timeout=10).json()["engine"]
    assert engine_stats["retired_output_tokens_total"] > retired_before


def test_an_engine_killed_mid_rollout_loses_no_sample(pool: EnginePool) -> None:
    # Kills an engine of the shared pool: the last test of this module. (A pool of its own
    # would wait forever for CPUs: Ray gives each engine one and the cluster has two.)
    with pool.client("tiny", max_concurrency=12) as rollouts:
        survivor = pool.urls[1]
        killed = threading.Event()
        lock = threading.Lock()

        def env(state: SampleState) -> EnvStep:
            # After a first turn on the victim, kill it: every sample there must move.
            with lock:
                if not killed.is_set() and state.turn == 1:
                    pool.kill(0)
                    killed.set()
            return EnvStep([5, 6, 7], done=state.turn >= 3)

        groups = rollouts.generate_many(
            PROMPTS, n=2, sampling=SamplingParams(max_tokens=6, seed=3), env=env, max_turns=3
        )
    assert killed.is_set()
    assert not any(isinstance(g, RolloutError) for g in groups), [str(g) for g in groups]
    samples = [s for g in groups for s in g.samples]
    # Every sample once, each complete: three model turns with two observations between.
    assert sorted((s.group_id, s.index) for s in samples) == sorted({(s.group_id, s.index) for s in samples})
    assert len(samples) == len(PROMPTS) * 2 and all(s.turns == 3 for s in samples)
    assert all(s.response_mask.count(0) == 6 for s in samples)
    # Every sample's later turns began after the kill: all of them finished on the survivor.
    assert {s.backend for s in samples} == {survivor}
