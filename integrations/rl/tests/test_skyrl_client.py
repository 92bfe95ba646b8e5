"""``AgentspecInferenceClient`` and ``with_agentspec`` against a stand-in for SkyRL's
``RemoteInferenceClient``, on two real ``agentspec serve`` engines where they make HTTP calls.

Why a stand-in: skyrl 0.4 needs Python >= 3.12, and the module that holds its client
imports torch, which for Python 3.12 resolves to the CUDA build (gigabytes of nvidia-*
wheels); neither fits this environment. The stand-in reproduces what the adapter relies on
in skyrl 0.4.0's ``RemoteInferenceClient``: a dataclass with its public fields
(``proxy_url``, ``server_urls``, ``data_parallel_size``, ``model_name``, the routed-expert
and sample-support switches, ``tokenizer``), its ``__post_init__`` check, ``generate``
calling ``_generate_single`` once per prompt with the same keyword arguments and reading
back ``response_ids``, ``response_logprobs`` and ``stop_reason``, ``finish_session`` (a
notice to SkyRL's router), and the ``weight_version`` counter that
``increment_weight_version`` advances after each weight sync. Its own ``_generate_single``
(vLLM's ``/inference/v1/generate``) fails the test if it is ever reached.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from test_skyrl_server import PROMPT, skyrl_sampling

from agentspec import wire
from agentspec.testing.stats import session_stats
from agentspec_rl import skyrl
from agentspec_rl.skyrl import with_agentspec

SKYRL_MODULE = "skyrl.backends.skyrl_train.inference_servers.remote_inference_client"
NOWHERE = "http://127.0.0.1:9"  # port 9 (discard): nothing answers


@dataclass
class RemoteInferenceClient:
    """skyrl 0.4.0's ``RemoteInferenceClient``, reduced to the contract the adapter uses."""

    proxy_url: str
    server_urls: list[str]
    data_parallel_size: int
    model_name: str = "default"
    enable_return_routed_experts: bool = False
    enable_return_sample_support_set: bool = False
    uses_lora_weight_sync: bool = False
    tokenizer: Any = None
    _weight_version: int = field(default=0, repr=False)
    _router_finished: list[str] = field(default_factory=list, repr=False)  # what SkyRL's router was told

    @property
    def weight_version(self) -> int:
        return self._weight_version

    def increment_weight_version(self) -> None:
        self._weight_version += 1

    def __post_init__(self) -> None:
        if self.data_parallel_size <= 0:
            raise ValueError(f"Expected `data_parallel_size` >0, got {self.data_parallel_size}")

    async def generate(self, input_batch: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """SkyRL's fan-out: one ``_generate_single`` per prompt, with SkyRL's arguments."""
        prompts = input_batch["prompt_token_ids"]
        sampling = input_batch.get("sampling_params") or {}
        session_ids = input_batch.get("session_ids")
        mm_features = input_batch.get("mm_features")
        results = await asyncio.gather(
            *(
                self._generate_single(
                    prompt_token_ids=prompts[i],
                    sampling_params=sampling,
                    session_id=session_ids[i] if session_ids and i < len(session_ids) else None,
                    mm_features=mm_features[i] if mm_features and i < len(mm_features) else None,
                    routed_experts_prompt_start=None,
                    return_sample_support=False,
                    model=model or self.model_name,
                    cache_salt=input_batch.get("cache_salt"),
                )
                for i in range(len(prompts))
            )
        )
        return {
            "stop_reasons": [r["stop_reason"] for r in results],
            "response_ids": [r["response_ids"] for r in results],
            "response_logprobs": [r["response_logprobs"] for r in results]
            if sampling.get("logprobs") is not None
            else None,
        }

    async def _generate_single(self, **_: Any) -> dict[str, Any]:
        raise AssertionError("SkyRL's own /inference/v1/generate was called: the adapter did not take over")

    async def finish_session(self, session_id: str) -> None:
        if session_id:
            self._router_finished.append(session_id)


@pytest.fixture
def skyrl_stand_in(monkeypatch: pytest.MonkeyPatch) -> type[RemoteInferenceClient]:
    """SkyRL's client module, holding the stand-in, and the adapter's class built on it
    (removed again afterwards, so that other tests see a machine without SkyRL)."""
    parts = SKYRL_MODULE.split(".")
    for depth in range(1, len(parts) + 1):
        monkeypatch.setitem(sys.modules, ".".join(parts[:depth]), types.ModuleType(".".join(parts[:depth])))
    sys.modules[SKYRL_MODULE].RemoteInferenceClient = RemoteInferenceClient  # type: ignore[attr-defined]
    # In the module's namespace itself: getattr would run the module's __getattr__ and keep its class.
    monkeypatch.setitem(vars(skyrl), "AgentspecInferenceClient", skyrl._define_client())
    return RemoteInferenceClient


def skyrl_client(engines: list[str], **options: Any) -> RemoteInferenceClient:
    """As ``BasePPOExp.get_inference_client`` builds it for external servers."""
    return RemoteInferenceClient(proxy_url=engines[0], server_urls=list(engines), data_parallel_size=1, **options)


@pytest.fixture
def engines(agentspec_server: Any, agentspec_peer_server: Any) -> list[str]:
    return [agentspec_server.url, agentspec_peer_server.url]


def engines_holding(engines: list[str], session_id: str) -> list[str]:
    """The engines that hold ``session_id``, once any does (statistics come a moment late)."""
    deadline = time.monotonic() + 10
    while True:
        on = [e for e in engines if session_stats(e, session_id, wait=False) is not None]
        if on or time.monotonic() > deadline:
            return on
        time.sleep(0.2)


def live_version(engine: str) -> int | None:
    return httpx.get(engine + wire.SERVER_STATS_PATH, timeout=10).json()["engine"].get("policy_version")


def test_with_agentspec_keeps_skyrls_settings_and_pickles(skyrl_stand_in: type) -> None:
    original = skyrl_client(["http://gpu1:8001", "http://gpu2:8001"], model_name="policy", tokenizer="tok")
    client = with_agentspec(original, run_id="r1", keep_old_outputs=True)
    assert type(client) is skyrl.AgentspecInferenceClient and isinstance(client, skyrl_stand_in)
    assert (client.proxy_url, client.server_urls, client.model_name, client.tokenizer) == (
        "http://gpu1:8001",
        ["http://gpu1:8001", "http://gpu2:8001"],
        "policy",
        "tok",
    )
    sessions = client.agentspec
    assert sessions.config.backends == ("http://gpu1:8001", "http://gpu2:8001") and sessions.config.model == "policy"
    assert (sessions.run_id, sessions.keep_old_outputs) == ("r1", True)
    # SkyRL ships its client to Ray workers: the copy is of the same class, with its settings.
    copy = pickle.loads(pickle.dumps(client))
    assert type(copy) is type(client) and copy.agentspec.run_id == "r1"
    # Turned twice, one class: pickle finds every client's class by name.
    assert type(with_agentspec(original)) is type(client)


def test_what_agentspec_cannot_serve_is_refused_by_name(skyrl_stand_in: type) -> None:
    with pytest.raises(ValueError, match="enable_return_routed_experts"):
        with_agentspec(skyrl_client([NOWHERE], enable_return_routed_experts=True))
    with pytest.raises(ValueError, match="enable_return_sample_support_set"):
        with_agentspec(skyrl_client([NOWHERE], enable_return_sample_support_set=True))
    with pytest.raises(ValueError, match="data_parallel_size"):  # SkyRL's own check still runs
        skyrl.AgentspecInferenceClient(proxy_url=NOWHERE, server_urls=[NOWHERE], data_parallel_size=0)
    client = with_agentspec(skyrl_client([NOWHERE]))
    batch = {"prompt_token_ids": [PROMPT], "sampling_params": skyrl_sampling(4), "mm_features": [{"image": 1}]}
    with pytest.raises(ValueError, match="multimodal"):  # refused before anything is sent
        asyncio.run(client.generate(batch))


def test_a_failed_announcement_is_logged_and_training_goes_on(
    skyrl_stand_in: type, caplog: pytest.LogCaptureFixture
) -> None:
    client = with_agentspec(skyrl_client([NOWHERE]))
    with caplog.at_level(logging.WARNING, logger="agentspec_rl.skyrl"):
        client.increment_weight_version()
    assert client.weight_version == 1 and client.agentspec.announced is None
    assert "could not announce policy version 1" in caplog.text


@pytest.mark.server
def test_skyrls_generate_runs_a_group_on_one_engine(skyrl_stand_in: type, engines: list[str]) -> None:
    client = with_agentspec(skyrl_client(engines, model_name="tiny"), run_id="c1")
    trajectories = [f"7_{r}" for r in range(4)]  # SkyRL's f"{uid}_{repetition_id}"

    async def rollout() -> list[dict[str, Any]]:
        prompts, outputs = [list(PROMPT) for _ in trajectories], []
        try:
            for _turn in range(2):  # two model turns, an observation appended between them
                out = await client.generate(
                    {"prompt_token_ids": prompts, "sampling_params": skyrl_sampling(6), "session_ids": trajectories}
                )
                outputs.append(out)
                prompts = [p + ids + [5, 6, 7] for p, ids in zip(prompts, out["response_ids"], strict=True)]
            for sid in trajectories:
                await client.finish_session(sid)
            return outputs
        finally:
            await client.agentspec.aclose()

    for out in asyncio.run(rollout()):
        assert all(r in ("stop", "length") for r in out["stop_reasons"])
        for ids, logprobs in zip(out["response_ids"], out["response_logprobs"], strict=True):
            assert 1 <= len(ids) <= 6 and len(logprobs) == len(ids) and all(lp <= 0 for lp in logprobs)
    assert client._router_finished == trajectories  # SkyRL's own finish_session still runs
    holders = set()
    for r in range(len(trajectories)):
        sid = f"c1.v0.7/{r}"
        on = engines_holding(engines, sid)
        assert len(on) == 1, f"{sid} is on {on}"
        stats = session_stats(on[0], sid, until=lambda st: st["calls"] >= 2)
        assert stats is not None and stats["group_id"] == "c1.v0.7" and stats["calls"] == 2
        holders.add(on[0])
    assert len(holders) == 1, f"the group is spread over {holders}"


@pytest.mark.server
def test_a_weight_sync_announces_the_next_version_and_new_trajectories_run_under_it(
    skyrl_stand_in: type, engines: list[str]
) -> None:
    start = max(live_version(e) or 0 for e in engines)
    client = with_agentspec(skyrl_client(engines, model_name="tiny"), run_id="c2")
    client.increment_weight_version()  # what SkyRL's trainer calls after a weight sync
    assert client.weight_version == 1 and client.agentspec.announced == start + 1
    deadline = time.monotonic() + 10
    while any(live_version(e) != start + 1 for e in engines) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [live_version(e) for e in engines] == [start + 1, start + 1]

    async def one_turn() -> dict[str, Any]:
        try:
            return await client.generate(
                {"prompt_token_ids": [PROMPT], "sampling_params": skyrl_sampling(4), "session_ids": ["3_0"]}
            )
        finally:
            await client.agentspec.aclose()

    assert asyncio.run(one_turn())["response_ids"][0]
    # A trajectory after the sync is a session of a new group, under the new version.
    sid = "c2.v1.3/0"
    (engine,) = engines_holding(engines, sid)
    stats = session_stats(engine, sid)
    assert stats is not None and stats["group_id"] == "c2.v1.3" and stats["policy_version"] == start + 1
