"""Smoke test of benchmarks/rl_live.py: its pieces on the real model's shared test server.

The benchmark starts two fresh engines per arm and run, which is too slow for the suite;
here the same functions run small: GRPO groups sampled in a tenant of their own (both
"engines" the one shared server), a policy update on the real model, and the in-place
reload through vLLM's development routes, of the served weights themselves so that the
shared server's other tests see the same model. A policy announcement would change the
shared server for the tests after this one, so it is left to agentspec-rl's tests.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import rl_live

from agentspec.testing.server import VLLMServer


def test_placement_pins_or_spreads_every_group() -> None:
    spec = rl_live.RolloutSpec(tasks=4, samples=4, max_tokens=8, concurrency=2)
    pinned = rl_live.placement(spec, "pinned", 2)
    spread = rl_live.placement(spec, "spread", 2)
    for placed in (pinned, spread):
        assert sorted(w for engine in placed for w in engine) == [(t, i) for t in range(4) for i in range(4)]
        assert [len(engine) for engine in placed] == [8, 8]
    # Pinned: each group on one engine; spread: each group on both, half and half.
    assert [{t for t, _ in engine} for engine in pinned] == [{0, 2}, {1, 3}]
    assert all(sorted(t for t, _ in engine) == [0, 0, 1, 1, 2, 2, 3, 3] for engine in spread)


def test_reward_asks_for_the_named_definition() -> None:
    good = "Here it is:\n```python\ndef mean(xs):\n    return sum(xs) / len(xs)\n```"
    assert rl_live.reward(0, good) > 0.9
    assert rl_live.reward(0, "```python\ndef average(xs):\n    return 0\n```") < 0.1  # another name
    assert rl_live.reward(0, "```python\ndef mean(xs) return\n```") < 0.1  # does not parse
    # The length cost ranks two passing answers.
    assert rl_live.reward(0, good) > rl_live.reward(0, good + "\n" + "x" * 400)


def test_bad_options_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["--parts", "warmup"], "unknown parts: warmup"), (["--samples", "0"], "--samples")):
        with pytest.raises(SystemExit) as exit_:
            rl_live.main([*argv, "--model", "unused"])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_groups_sampled_policy_updated_and_reloaded(
    agentspec_real_server: VLLMServer, real_model_dir: Path, tmp_path: Path
) -> None:
    url = agentspec_real_server.url
    spec = rl_live.RolloutSpec(tasks=2, samples=2, max_tokens=16, concurrency=2)
    salt = f"rl-{uuid.uuid4().hex[:8]}"
    rollout = rl_live.sample_epoch([url, url], rl_live.placement(spec, "spread", 2), spec, salt, 7, salt=salt)
    assert len(rollout.calls) == 4 and len(rollout.counters) == 2
    assert {c.group for c in rollout.calls} == {f"{salt}-0", f"{salt}-1"}
    assert 0 < rollout.steps <= rollout.output_tokens <= 4 * 16 and rollout.al >= 1.0
    assert rollout.tokens_per_s > 0

    tasks = [int(c.group.rsplit("-", 1)[1]) for c in rollout.calls]
    weights = tmp_path / "policy-v1"
    update = rl_live.policy_update(real_model_dir, weights, rollout.calls, tasks, steps=1, lr=1e-4)
    assert update.samples == sum(1 for c in rollout.calls if c.output) and len(update.rewards) == 4
    assert update.logp_before < 0 and update.logp_after != update.logp_before
    assert (weights / "config.json").is_file() and list(weights.glob("*.safetensors"))
    assert (weights / "tokenizer.json").is_file()  # a complete model folder: it serves as it is

    # In place, the served weights again (the shared server must serve on unchanged); the
    # engine then scores a sample as the trainer's model does.
    rl_live.reload_policy(url, real_model_dir)
    probe = max(rollout.calls, key=lambda c: len(c.output))
    engine = rl_live.engine_logp(url, probe)
    trainer = rl_live._trainer_logp(real_model_dir, probe)
    assert engine == pytest.approx(trainer, abs=0.05), (engine, trainer)
    assert abs(rl_live._trainer_logp(weights, probe) - trainer) > 1e-4  # the update moved this sample
