"""The SkyRL adapter on two real ``agentspec serve`` engines, against SkyRL's documented contract.

SkyRL itself is not installed here: skyrl 0.4 needs Python >= 3.12, and the module that
holds its inference client imports torch at import time, which for Python 3.12 resolves
to the CUDA build and 16 nvidia-* wheels (gigabytes), far beyond a test environment's
budget. So these tests make the calls SkyRL's code makes, reproduced from its source
(skyrl 0.4.0):

- ``SkyRLGymGenerator.agent_loop`` sends every model turn of a trajectory through
  ``RemoteInferenceClient.generate`` with ``session_ids=[f"{uid}_{repetition_id}"]``
  (``uid`` the prompt's dataset row, ``repetition_id`` in ``range(n_samples_per_prompt)``),
  a token-id prompt that grows turn by turn, and the sampling dict of
  ``get_vllm_sampling_params`` (below); ``generate`` calls ``_generate_single`` once per
  prompt, which :class:`AgentspecInferenceClient` hands to
  :meth:`AgentspecSessions.generate` with exactly these arguments;
- it reads back ``response_ids``, ``response_logprobs`` (one per token when ``logprobs``
  is not None) and ``stop_reason``; when the trajectory ends it calls ``finish_session``;
- after every weight sync the trainer calls ``increment_weight_version()``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from agentspec import wire
from agentspec.testing.stats import session_stats
from agentspec_rl.skyrl import AgentspecSessions

pytestmark = pytest.mark.server

PROMPT = [17, 230, 54, 999, 12, 7, 401, 33]


def skyrl_sampling(max_tokens: int, **overrides: Any) -> dict[str, Any]:
    """``get_vllm_sampling_params`` of SkyRL's default ``generator.sampling_params``."""
    return {
        "min_tokens": 1,
        "skip_special_tokens": True,
        "include_stop_str_in_output": True,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "logprobs": 1,
        "stop": None,
        **overrides,
    }


@pytest.fixture
def engines(agentspec_server: Any, agentspec_peer_server: Any) -> list[str]:
    return [agentspec_server.url, agentspec_peer_server.url]


def live_version(engine: str) -> int | None:
    return httpx.get(engine + wire.SERVER_STATS_PATH, timeout=10).json()["engine"].get("policy_version")


def test_a_prompts_samples_are_one_group_on_one_engine_token_exact(engines: list[str]) -> None:
    sessions = AgentspecSessions(engines, "tiny", run_id="t1")
    n, uids = 4, ["17", "18"]

    async def trajectory(uid: str, rep: int) -> list[dict[str, Any]]:
        # Two model turns, an observation in between, as the generator's loop does.
        sid, prompt, turns = f"{uid}_{rep}", list(PROMPT), []
        for _ in range(2):
            out = await sessions.generate(prompt, skyrl_sampling(6), sid, version=0, model="tiny")
            turns.append(out)
            prompt += out["response_ids"] + [5, 6, 7]
        await sessions.finish(sid)
        return turns

    async def main() -> list[list[dict[str, Any]]]:
        try:
            return await asyncio.gather(*(trajectory(u, r) for u in uids for r in range(n)))
        finally:
            await sessions.aclose()

    results = asyncio.run(main())
    for turns in results:
        for out in turns:
            assert set(out) == {
                "response_ids",
                "response_logprobs",
                "stop_reason",
                "routed_experts",
                "rollout_sample_support",
            }
            assert out["response_ids"] and out["stop_reason"] in ("stop", "length")
            assert len(out["response_logprobs"]) == len(out["response_ids"]) and all(
                lp <= 0 for lp in out["response_logprobs"]
            )
    for uid in uids:
        group = f"t1.v0.{uid}"
        holders = set()
        for rep in range(n):
            sid = f"{group}/{rep}"
            on = [e for e in engines if session_stats(e, sid, wait=False) is not None]
            if not on:  # statistics are published a moment after each step
                on = [e for e in engines if session_stats(e, sid) is not None]
            assert len(on) == 1, f"{sid} is on {on}"
            stats = session_stats(on[0], sid, until=lambda st: st["calls"] >= 2)
            assert stats is not None and stats["group_id"] == group and stats["calls"] == 2
            holders.add(on[0])
        assert len(holders) == 1, f"group {group} is spread over {holders}"


def test_no_logprobs_and_a_lone_call(engines: list[str]) -> None:
    sessions = AgentspecSessions(engines, "tiny", run_id="t2")

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            greedy = skyrl_sampling(4, logprobs=None, temperature=0.0)
            return (
                await sessions.generate(PROMPT, greedy, "5_0", model="tiny"),
                await sessions.generate(PROMPT, greedy, None, model="tiny"),
            )
        finally:
            await sessions.aclose()

    named, alone = asyncio.run(main())
    assert named["response_logprobs"] is None and named["response_ids"] == alone["response_ids"]


def test_weight_syncs_announce_versions_after_the_live_one(engines: list[str]) -> None:
    start = max(live_version(e) or 0 for e in engines)
    sessions = AgentspecSessions(engines, "tiny", run_id="t3")
    assert sessions.announce(1) == start + 1  # numbered after what the engines already hold
    assert sessions.announce(1) == start + 1  # the same sync again changes nothing
    assert sessions.announce(2) == start + 2
    for engine in engines:
        for _ in range(50):
            if live_version(engine) == start + 2:
                break
            asyncio.run(asyncio.sleep(0.2))
        assert live_version(engine) == start + 2
    # A trajectory started after the sync is a new session in a new group.
    assert sessions.ids("9_0", 2).group_id == "t3.v2.9" != sessions.ids("9_0", 1).group_id
