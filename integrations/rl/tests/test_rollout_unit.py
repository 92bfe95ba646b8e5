"""The rollout library's checks and bookkeeping, without a server."""

from __future__ import annotations

import pytest

from agentspec.client import TokenCompletion, Turn
from agentspec_rl import EnvStep, RolloutClient, SamplingParams
from agentspec_rl._builder import SampleBuilder
from agentspec_rl._plan import plan_groups, sample_session_id


def completion(ids: tuple[int, ...], logprobs: tuple[float, ...] | None, reason: str) -> TokenCompletion:
    turn = Turn(index=0, kind="tokens", backend="http://b", attempts=1, text="", finish_reason=reason)
    return TokenCompletion(ids, "", reason, None, logprobs, None, None, "http://b", {}, turn)


@pytest.mark.parametrize(
    ("prompts", "n", "group_ids", "message"),
    [
        ([[]], 2, None, "prompt 0: the prompt is empty"),
        (["hello"], 2, None, "prompt 0: a prompt is token ids, not text"),
        ([[1, -2]], 2, None, "prompt 0: prompt token ids must be non-negative integers"),
        ([[1]], 0, None, "n must be at least 1, got 0"),
        ([[1], [2]], 2, ["g"], "1 group ids for 2 prompts"),
        ([[1], [2]], 2, ["g", "g"], "group 'g' is given two different prompts (prompts 0 and 1)"),
        ([[1], [1]], 2, ["g", "g"], "group 'g' is given the same prompt twice"),
        ([[1]], 2, ["a b"], "group id 'a b' must be 1 to 118 characters"),
    ],
)
def test_bad_rollouts_are_refused_naming_the_problem(prompts, n, group_ids, message) -> None:
    with pytest.raises(ValueError) as exc:
        plan_groups(prompts, n, group_ids)
    assert message in str(exc.value)


def test_each_sample_is_a_session_of_its_group() -> None:
    (plan,) = plan_groups([[1, 2, 3]], 4, ["task-9"])
    assert (plan.group_id, plan.prompt, plan.n) == ("task-9", (1, 2, 3), 4)
    assert sample_session_id("task-9", 3) == "task-9/3"
    (auto,) = plan_groups([[1]], 1, None)
    assert auto.group_id.startswith("grp-")


def test_sampling_fields_give_each_sample_its_own_seed() -> None:
    params = SamplingParams(max_tokens=16, temperature=0.7, seed=100, stop_token_ids=(2,), extra={"min_p": 0.1})
    fields = params.request_fields(3)
    assert fields["seed"] == 103 and fields["stop_token_ids"] == [2] and fields["min_p"] == 0.1
    assert fields["logprobs"] == 0 and fields["return_tokens_as_token_ids"] is True
    assert "logprobs" not in SamplingParams(logprobs=False).request_fields(0)
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)


def test_builder_masks_environment_tokens_and_keeps_model_logprobs() -> None:
    b = SampleBuilder("g", 0, "g/0", [1, 2], version=7)
    state = b.add_model_turn(completion((10, 11), (-0.5, -0.25), "stop"))
    assert state.turn == 1 and state.last_output_token_ids == (10, 11) and b.next_prompt() == (1, 2, 10, 11)
    b.add_env_step(EnvStep([20, 21, 22]))
    assert b.next_prompt() == (1, 2, 10, 11, 20, 21, 22) and not b.done
    b.add_model_turn(completion((12,), (-1.0,), "length"))
    b.add_env_step(EnvStep(done=True))
    s = b.build()
    assert s.response_token_ids == (10, 11, 20, 21, 22, 12)
    assert s.response_mask == (1, 1, 0, 0, 0, 1)
    assert s.logprobs == (-0.5, -0.25, None, None, None, -1.0)
    assert s.finish_reasons == ("stop", "length") and s.finish_reason == "length" and s.turns == 2
    assert s.policy_version == 7 and b.done
    with pytest.raises(ValueError, match="observation token ids must be non-negative"):
        b.add_env_step(EnvStep([-1]))


def test_bad_policy_versions_are_refused_before_any_server_is_told() -> None:
    # Port 9 (discard) has no server: a refusal that reached the network would fail otherwise.
    with RolloutClient(["http://127.0.0.1:9"], "m") as client:
        for bad in (-1, True, 1.5):
            with pytest.raises(ValueError, match="non-negative integer"):
                client.on_weight_update(bad)  # type: ignore[arg-type]
        client.policy_version = 3
        with pytest.raises(ValueError, match="older than the live one"):
            client.on_weight_update(2)
