"""Rollouts through the real stack: two ``agentspec serve`` engines on the tiny model."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import httpx
import pytest

from agentspec import wire
from agentspec.testing.stats import session_stats
from agentspec_rl import (
    AsyncRolloutClient,
    EnvStep,
    RolloutClient,
    RolloutError,
    SampleState,
    SamplingParams,
)

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
        assert (
            seen is not None and seen["group_id"] == "grpo-a" and session_stats(other, s.session_id, wait=False) is None
        )


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
        server = session_stats(s.backend, s.session_id, until=lambda st: st["calls"] >= 2)
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
        bad, good = client.generate_many(
            [too_long, PROMPT], n=2, sampling=SamplingParams(max_tokens=64), group_ids=["big", "fine"]
        )
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
        assert {
            s.policy_version for s in client.generate(PROMPT, n=2, sampling=SamplingParams(max_tokens=4)).samples
        } == {start}
    assert anyio.run(main) == (start + 1, start + 1)
    for engine in engines:
        deadline = 50
        while live(engine) != start + 1 and deadline:
            anyio.run(anyio.sleep, 0.2)
            deadline -= 1
        assert live(engine) == start + 1


def _live(engine: str) -> int | None:
    return httpx.get(engine + wire.SERVER_STATS_PATH, timeout=10).json()["engine"].get("policy_version")


def test_an_engine_ahead_of_the_caller_is_named_and_one_behind_catches_up(engines: list[str]) -> None:
    ahead = engines[0]  # the other engine is behind
    version = max(int(_live(e) or 0) for e in engines) + 1
    # One engine already runs a newer policy than the caller is about to announce.
    assert httpx.post(ahead + wire.POLICY_PATH, json={"version": version + 1}, timeout=60).status_code == 200
    with RolloutClient(engines, "tiny") as client:
        message = (
            rf"engine {ahead} refused policy version {version}: policy version {version}"
            rf" is older than the live one \({version + 1}\)"
        )
        with pytest.raises(ValueError, match=message):
            client.on_weight_update(version)
        assert client.policy_version is None  # not every engine took it

    async def announce() -> None:
        async with AsyncRolloutClient(engines, "tiny") as twin:
            await twin.on_weight_update(version)

    with pytest.raises(ValueError, match=f"engine {ahead} refused"):  # the async twin alike, not an exception group
        anyio.run(announce)
    # The engine behind was told all the same; announcing the newer version brings it level,
    # and the engine that had it already takes the same version again.
    with RolloutClient(engines, "tiny") as client:
        client.on_weight_update(version + 1)
        assert client.policy_version == version + 1
    for engine in engines:
        deadline = 50
        while _live(engine) != version + 1 and deadline:
            anyio.run(anyio.sleep, 0.2)
            deadline -= 1
        assert _live(engine) == version + 1, engine


def test_a_group_given_two_prompts_is_refused_by_name_and_the_client_goes_on(engines: list[str]) -> None:
    tag = uuid.uuid4().hex[:6]
    mixed, fine = f"mixed-{tag}", f"fine-{tag}"
    with RolloutClient(engines, "tiny") as client:
        with pytest.raises(ValueError, match=f"group '{mixed}' is given two different prompts"):
            client.generate_many([PROMPT, PROMPT[::-1], PROMPT[:4]], n=2, group_ids=[mixed, mixed, fine])
        # Refused before anything was sent: no sample of any of its groups reached an engine.
        for sid in (f"{mixed}/0", f"{fine}/0"):
            assert all(session_stats(e, sid, wait=False) is None for e in engines)
        group = client.generate(PROMPT[:4], n=2, sampling=SamplingParams(max_tokens=4), group_id=fine)
    assert [s.index for s in group.samples] == [0, 1] and all(s.response_token_ids for s in group.samples)
