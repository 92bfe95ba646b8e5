"""agentspec's verl adapter driven by verl's own code (verl 0.9, no vLLM in this
environment) against two real ``agentspec serve`` engines on the tiny model.

- verl's config: the hydra overrides a user sets compose with verl's ``ppo_trainer`` config,
  verl's ``RolloutConfig`` takes them, and verl's loader finds the manager class;
- verl's agent loop worker (``AgentLoopWorker._run_agent_loop``, its registry and hydra
  instantiation) runs an agent loop whose ``server_manager`` is the adapter: a GRPO group's
  samples land on one engine, each a session of the group, multi-turn calls in one session;
- what comes back is verl's ``TokenOutput``, with token ids and log-probabilities;
- the example (examples/rl/verl_agent_loop.py) prints overrides that verl's config takes,
  and runs its group on one engine.
"""

from __future__ import annotations

import asyncio
import pickle
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_module
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.import_utils import load_class_from_fqn
from verl.workers.rollout.replica import TokenOutput

from agentspec.testing.stats import session_stats
from agentspec_rl import verl as adapter

PROMPT = [17, 230, 54, 999, 12, 7, 401, 33]
MANAGER = "agentspec_rl.verl.AgentspecAgentLoopManager"
EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "rl" / "verl_agent_loop.py"


def verl_config(backends: list[str], *extra: str) -> Any:
    overrides = [
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.response_length=6",
        f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER}",
        f"+actor_rollout_ref.rollout.custom.agentspec.backends=[{','.join(backends)}]",
        "+actor_rollout_ref.rollout.custom.agentspec.model=tiny",
        *extra,
    ]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture
def engines(agentspec_server: Any, agentspec_peer_server: Any) -> list[str]:
    return [agentspec_server.url, agentspec_peer_server.url]


def test_the_config_a_user_sets_is_verls() -> None:
    config = verl_config(["http://gpu1:8001", "http://gpu2:8001"])
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)  # verl's own check of the section
    assert rollout.custom == {"agentspec": {"backends": ["http://gpu1:8001", "http://gpu2:8001"], "model": "tiny"}}
    assert (
        load_class_from_fqn(rollout.agent.agent_loop_manager_class, "AgentLoopManager")
        is adapter.AgentspecAgentLoopManager
    )
    client = adapter.AgentspecServerClient.from_verl_config(config)
    assert client.config.backends == ("http://gpu1:8001", "http://gpu2:8001") and client.config.model == "tiny"
    assert client.defaults.response_length == 6
    # verl sends the client to its worker actors.
    assert pickle.loads(pickle.dumps(client)).config == client.config


def test_the_managers_are_verls_with_agentspec_workers() -> None:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopManager,
        AgentLoopWorker,
    )
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

    assert issubclass(adapter.AgentspecAgentLoopManager, AgentLoopManagerTQ)
    assert issubclass(adapter.AgentspecAgentLoopManagerV0, AgentLoopManager)
    assert issubclass(adapter.AgentspecAgentLoopWorker, AgentLoopWorker)
    assert issubclass(adapter.AgentspecAgentLoopWorkerV0, AgentLoopWorker)
    # Pickled by reference, as Ray ships a class to its actors.
    assert pickle.loads(pickle.dumps(adapter.AgentspecAgentLoopWorker)) is adapter.AgentspecAgentLoopWorker


def test_a_config_without_engines_is_refused_naming_the_key() -> None:
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.rollout.name=vllm"])
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.custom\.agentspec\.backends"):
        adapter.AgentspecServerClient.from_verl_config(config)


class TwoTurnLoop:
    """An agent loop as verl instantiates one (hydra, with its keyword arguments): two model
    turns in one trajectory, one request id, an observation between them."""

    def __init__(self, server_manager: Any, **_: Any) -> None:
        self.server_manager = server_manager

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        prompt = list(PROMPT)
        outputs = []
        for _turn in range(2):
            out = await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt, sampling_params=dict(sampling_params)
            )
            outputs.append(out)
            prompt = prompt + out.token_ids + [5, 6, 7]
        return {"request_id": request_id, "outputs": outputs, "uid": kwargs["uid"]}


def _worker(config: Any) -> Any:
    """verl's agent loop worker (the adapter's V0 class) as a plain object, without its Ray
    actor and the model it would load: what ``_run_agent_loop`` reads, set directly."""
    cls = adapter.AgentspecAgentLoopWorkerV0

    class Worker(cls):  # type: ignore[misc, valid-type]
        async def _agent_loop_postprocess(self, output: Any, validate: bool, **kwargs: Any) -> Any:
            return output  # verl pads tensors here; the test reads the raw output

    worker = object.__new__(Worker)
    worker.config = config
    worker.llm_client = adapter.AgentspecServerClient.from_verl_config(config)
    worker.tokenizer = worker.processor = worker.hf_model_type = worker.dataset_cls = None
    worker.tools = []
    return worker


def test_a_group_runs_through_verls_worker_on_one_engine(engines: list[str]) -> None:
    _agent_loop_registry["agentspec_two_turns"] = {"_target_": f"{__name__}.TwoTurnLoop"}
    config = verl_config(engines)
    worker = _worker(config)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    uid = str(uuid.uuid4())

    async def group() -> list[dict[str, Any]]:
        runs = [
            worker._run_agent_loop(
                dict(sampling, seed=i),
                {"step": 3, "sample_index": 0, "rollout_n": i, "validate": False},
                agent_name="agentspec_two_turns",
                trace=False,
                uid=uid,
                raw_prompt=[],
            )
            for i in range(4)
        ]
        return await asyncio.gather(*runs)

    results = asyncio.run(group())
    backends = set()
    for result in results:
        for out in result["outputs"]:
            assert isinstance(out, TokenOutput) and 1 <= len(out.token_ids) <= 6
            assert out.log_probs is not None and len(out.log_probs) == len(out.token_ids)
            assert all(lp <= 0 for lp in out.log_probs) and out.stop_reason == "completed"
            assert out.extra_fields["global_steps"] == out.extra_fields["min_global_steps"] == 3
            backends.add(out.extra_fields["agentspec_backend"])
    (engine,) = backends  # the whole group on one engine
    other = next(e for e in engines if e != engine)
    for result in results:
        session = f"{uid}/{result['request_id']}"
        seen = session_stats(engine, session)
        assert seen is not None and seen["group_id"] == uid and seen["calls"] == 2  # both turns, one session
        assert session_stats(other, session, wait=False) is None
    assert len({tuple(r["outputs"][0].token_ids) for r in results}) > 1  # four samples, not four copies


def test_a_call_outside_a_trajectory_is_its_own_session(engines: list[str]) -> None:
    client = adapter.AgentspecServerClient(engines, "tiny", defaults=adapter.RolloutDefaults(response_length=4))
    request_id = uuid.uuid4().hex
    out = asyncio.run(client.generate(request_id, prompt_ids=PROMPT, sampling_params={"temperature": 0.0}))
    assert isinstance(out, TokenOutput) and len(out.token_ids) == 4 and out.log_probs is None
    assert "global_steps" not in out.extra_fields
    seen = session_stats(out.extra_fields["agentspec_backend"], request_id)
    assert seen is not None and seen["calls"] == 1


def test_unsupported_inputs_are_refused_before_anything_is_sent() -> None:
    client = adapter.AgentspecServerClient(["http://127.0.0.1:9"], "tiny")
    with pytest.raises(ValueError, match="'n' is not supported"):
        asyncio.run(client.generate("r1", prompt_ids=PROMPT, sampling_params={"n": 2}))
    with pytest.raises(NotImplementedError, match="text only"):
        asyncio.run(client.generate("r1", prompt_ids=PROMPT, sampling_params={}, image_data=[object()]))
    with pytest.raises(TypeError, match="kv_transfer_params"):
        asyncio.run(client.generate("r1", prompt_ids=PROMPT, sampling_params={}, kv_transfer_params={}))


def test_a_new_step_is_announced_to_every_engine_as_the_policy_version(engines: list[str]) -> None:
    import httpx

    from agentspec import wire

    def versions() -> list[Any]:
        return [httpx.get(e + wire.SERVER_STATS_PATH).json()["engine"].get("policy_version") for e in engines]

    live = [v for v in versions() if v is not None]
    step = max(live, default=0) + 1
    client = adapter.AgentspecServerClient(engines, "tiny")
    client.announce(step)
    # The engines publish their statistics a moment after the update.
    deadline = time.monotonic() + 10
    while versions() != [step, step] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert versions() == [step, step]


def run_example(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_examples_overrides_are_what_verls_config_takes(engines: list[str]) -> None:
    printed = run_example("--backends", *engines, "--model", "tiny", "--print-config")
    overrides = re.findall(r"^\s*(\+actor_rollout_ref\.\S+)", printed, re.MULTILINE)
    assert len(overrides) == 3 and printed.startswith("python -m verl.trainer.main_ppo")
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=["actor_rollout_ref.rollout.name=vllm", *overrides])
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert (
        load_class_from_fqn(rollout.agent.agent_loop_manager_class, "AgentLoopManager")
        is adapter.AgentspecAgentLoopManager
    )
    client = adapter.AgentspecServerClient.from_verl_config(config)
    assert client.config.backends == tuple(engines) and client.config.model == "tiny"


def test_the_example_runs_its_group_on_one_engine(engines: list[str]) -> None:
    printed = run_example("--backends", *engines, "--model", "tiny", "--n", "3", "--max-tokens", "4")
    samples = re.findall(r"^sample (\d): (\d+) tokens, log-probability (\S+), on (\S+)$", printed, re.MULTILINE)
    assert [int(i) for i, *_ in samples] == [0, 1, 2], printed
    assert all(1 <= int(n) <= 4 and float(lp) <= 0 and on in engines for _, n, lp, on in samples)
    assert len({on for *_, on in samples}) == 1 and printed.rstrip().endswith(": 1 engine(s)")
