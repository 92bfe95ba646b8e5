"""Rollouts through the real stack: two ``agentspec serve`` engines on the tiny model."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx
import pytest
from agentspec_rl import (
    AsyncRolloutClient,
    EnvStep,
    RolloutClient,
    RolloutError,
    SampleState,
    SamplingParams,
)

from agentspec import wire
from agentspec.testing.stats import session_stats

pytestmark = pytest.mark.server

PROMPT = [17, 230, 54, 999, 12, 7, 401, 33]


@pytest.fixture
def engines(agentspec_server: Any, agentspec_peer_server: Any) -> list[str]:
    return [agentspec_server.url, agentspec_peer_server.url]


def test_a_group_is_token_exact_and_lands_on_one_engine(engines: list[str]) -> None:
    with RolloutClient(engines, "tiny") as client:
        group = client.generate(PROMPT, n=4, sampling=SamplingParams(max_tokens=12, seed=5), group_id="grpo-a")
    assert [s.index for s in group.samples] == [0, 1, 2, 3] and group.prompt_token_ids == tuple(PROMPT)
    for s in group.samples:
        assert s.response_token_ids and set(s.response_mask) == {1}
        assert len(s.logprobs) == len(s.response_token_ids) and all(lp is not None and lp <= 0 for lp in s.logprobs)
        assert s.finish_reason in ("stop", "length") and s.policy_version is None
    # Different seeds per sample: not four copies of one sample.
    assert len({s.response_token_ids for s in group.samples}) > 1
    (engine,) = {s.backend for s in group.samples}
    other = next(e for e in engines if e != engine)
    for s in group.samples:
        seen = session_stats(engine, s.session_id)
        assert seen is not None and seen["group_id"] == "grpo-a" and session_stats(other, s.session_id, wait=False) is None


def test_multi_turn_samples_append_observations_as_tokens(engines: list[str]) -> None:
    seen: list[SampleState] = []

    def env(state: SampleState) -> EnvStep:
        seen.append(state)
        return EnvStep([5, 6, 7], done=state.turn >= 2)

    with RolloutClient(engines, "tiny") as client:
        group = client.generate(PROMPT, n=2, sampling=SamplingParams(max_tokens=6, temperature=0), env=env, max_turns=3)
    for s in group.samples:
        first = next(st.last_output_token_ids for st in seen if st.index == s.index and st.turn == 1)
        second = next(st.last_output_token_ids for st in seen if st.index == s.index and st.turn == 2)
        assert s.turns == 2 and s.response_token_ids == (*first, 5, 6, 7, *second, 5, 6, 7)
        assert s.response_mask == (1,) * len(first) + (0, 0, 0) + (1,) * len(second) + (0, 0, 0)
        assert s.logprobs[len(first) : len(first) + 3] == (None, None, None)
        server = session_stats(s.backend, s.session_id)
        assert server is not None and server["calls"] == 2


def test_stop_reasons_per_sample(engines: list[str]) -> None:
    greedy = SamplingParams(max_tokens=3, temperature=0)
    with RolloutClient(engines, "tiny") as client:
        (sample,) = client.generate(PROMPT, n=1, sampling=greedy).samples
        assert sample.finish_reason == "length" and len(sample.response_token_ids) == 3
        first = sample.response_token_ids[0]
        stopping = SamplingParams(max_tokens=3, temperature=0, stop_token_ids=(first,))
        (stopped,) = client.generate(PROMPT, n=1, sampling=stopping).samples
    assert stopped.finish_reason == "stop" and stopped.response_token_ids[:1] == (first,)
    assert len(stopped.response_token_ids) <= 1


def test_a_sample_over_the_context_fails_its_group_only(engines: list[str]) -> None:
    too_long = [11] * 2100  # longer than the tiny model's context (2048 tokens)
    with RolloutClient(engines, "tiny") as client:
        bad, good = client.generate_many([too_long, PROMPT], n=2, sampling=SamplingParams(max_tokens=64), group_ids=["big", "fine"])
    assert isinstance(bad, RolloutError) and bad.group_id == "big"
    assert "the server refused it" in str(bad) and "context" in str(bad).lower()
    assert not isinstance(good, RolloutError) and len(good.samples) == 2


def test_async_twin_matches_the_sync_client_and_records_versions(engines: list[str]) -> None:
    greedy = SamplingParams(max_tokens=8, temperature=0)
    with RolloutClient(engines, "tiny") as client:
        client.policy_version = 4
        sync = client.generate(PROMPT, n=2, sampling=greedy)

    async def main() -> Any:
        async with AsyncRolloutClient(engines, "tiny") as client:
            client.policy_version = 4  # the version is recorded without telling the servers again

            async def env(state: SampleState) -> EnvStep | None:
                await anyio.lowlevel.checkpoint()
                return None

            return await client.generate(PROMPT, n=2, sampling=greedy, env=env, max_turns=2)

    group = anyio.run(main)
    assert [s.response_token_ids for s in group.samples] == [s.response_token_ids for s in sync.samples]
    assert {s.policy_version for s in group.samples} == {4} == {s.policy_version for s in sync.samples}
    assert all(s.turns == 1 for s in group.samples)  # the environment ended them after one turn


def test_a_weight_update_reaches_every_engine(engines: list[str]) -> None:
    def live(base: str) -> Any:
        return httpx.get(base + wire.SERVER_STATS_PATH, timeout=10).json()["engine"].get("policy_version")

    start = max(int(live(e) or 0) for e in engines) + 1

    async def main() -> tuple[int | None, int | None]:
        async with AsyncRolloutClient(engines, "tiny") as client:
            await client.on_weight_update(start + 1)
            group = await client.generate(PROMPT, n=2, sampling=SamplingParams(max_tokens=4))
            return client.policy_version, group.samples[0].policy_version

    with RolloutClient(engines, "tiny") as client:
        client.on_weight_update(start, keep_old_outputs=True)
        assert {s.policy_version for s in client.generate(PROMPT, n=2, sampling=SamplingParams(max_tokens=4)).samples} == {start}
    assert anyio.run(main) == (start + 1, start + 1)
    for engine in engines:
        deadline = 50
        while live(engine) != start + 1 and deadline:
            anyio.run(anyio.sleep, 0.2)
            deadline -= 1
        assert live(engine) == start + 1


def _live(base: str) -> int:
    return int(httpx.get(base + wire.SERVER_STATS_PATH, timeout=10).json()["engine"].get("policy_version") or 0)


def test_a_weight_update_retires_the_old_policys_drafts_by_version(engines: list[str]) -> None:
    """Greedy samples, one at a time, on one engine: an epoch under version v, then the same
    prompt under v+1 with v's outputs kept, then under v+2 with them retired. The sessions'
    statistics by version show which policy each ran under, and the kept epoch drafting more."""
    engine, greedy, tag = engines[0], SamplingParams(max_tokens=40, temperature=0), uuid.uuid4().hex[:8]
    version = _live(engine) + 1
    with RolloutClient([engine], "tiny", max_concurrency=1) as client:
        client.on_weight_update(version)
        first = client.generate(PROMPT, n=2, sampling=greedy, group_id=f"ep1-{tag}")
        client.on_weight_update(version + 1, keep_old_outputs=True)
        (kept,) = client.generate(PROMPT, n=1, sampling=greedy, group_id=f"ep2-{tag}").samples
        retired_before = httpx.get(engine + wire.SERVER_STATS_PATH, timeout=10).json()["engine"]["retired_output_tokens_total"]
        client.on_weight_update(version + 2)
        (fresh,) = client.generate(PROMPT, n=1, sampling=greedy, group_id=f"ep3-{tag}").samples
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
