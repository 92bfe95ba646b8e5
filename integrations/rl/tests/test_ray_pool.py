"""Engines as Ray actors on a local Ray cluster (CPU), each running ``agentspec serve`` on
the tiny model: groups pinned to one engine, and an engine killed mid-rollout costing no
sample. Run apart from the main suite (``-m ray``; scripts/test.sh does)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentspec_rl import EnvStep, RolloutError, SampleState, SamplingParams

from agentspec.engine.config import EngineSettings
from agentspec.testing.pytest_plugin import TEST_INDEX_CONFIG
from agentspec.testing.server import TEST_SERVER_ARGS
from agentspec.testing.stats import session_stats

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'agentspec-rl[ray]')")
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


def test_each_group_stays_on_one_engine(cluster: None, tiny_model_dir: Path) -> None:
    with _pool(tiny_model_dir) as pool, pool.client("tiny", max_concurrency=8) as rollouts:
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


def test_an_engine_killed_mid_rollout_loses_no_sample(cluster: None, tiny_model_dir: Path) -> None:
    with _pool(tiny_model_dir) as pool, pool.client("tiny", max_concurrency=12) as rollouts:
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

        groups = rollouts.generate_many(PROMPTS, n=2, sampling=SamplingParams(max_tokens=6, seed=3), env=env, max_turns=3)
    assert killed.is_set()
    assert not any(isinstance(g, RolloutError) for g in groups), [str(g) for g in groups]
    samples = [s for g in groups for s in g.samples]
    # Every sample once, each complete: three model turns with two observations between.
    assert sorted((s.group_id, s.index) for s in samples) == sorted({(s.group_id, s.index) for s in samples})
    assert len(samples) == len(PROMPTS) * 2 and all(s.turns == 3 for s in samples)
    assert all(s.response_mask.count(0) == 6 for s in samples)
    # Every sample's later turns began after the kill: all of them finished on the survivor.
    assert {s.backend for s in samples} == {survivor}
