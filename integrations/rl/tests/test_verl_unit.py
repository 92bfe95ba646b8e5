"""agentspec_rl.verl without verl: the module imports, the sampling parameters map as
documented, and what cannot be mapped is refused by name. verl's own code drives the
adapter in tests/verl_adapter (its own environment, scripts/test_verl.sh)."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from agentspec_rl import verl as adapter

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}


def test_verls_default_request_maps_to_completions_fields() -> None:
    limits = adapter.RolloutDefaults(prompt_length=16, response_length=8)
    fields = adapter.request_fields(dict(GREEDY, logprobs=True), 10, limits)
    assert fields == {
        "max_tokens": 8,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "repetition_penalty": 1.0,
        "ignore_eos": False,
    }


def test_the_length_budget_is_verls() -> None:
    limits = adapter.RolloutDefaults(prompt_length=16, response_length=8, max_model_len=30)
    assert adapter.request_fields(GREEDY, 20, limits)["max_tokens"] == 4  # 16 + 8 - 20
    assert adapter.request_fields(GREEDY, 40, limits.__class__(max_model_len=None))["max_tokens"] == 512
    assert adapter.request_fields(dict(GREEDY, max_tokens=99), 20, limits)["max_tokens"] == 10  # room left
    assert adapter.request_fields(dict(GREEDY, max_new_tokens=3), 20, limits)["max_tokens"] == 3
    with pytest.raises(ValueError, match="no room"):
        adapter.request_fields(GREEDY, 30, limits)


def test_stops_seeds_and_penalties_pass_through() -> None:
    limits = adapter.RolloutDefaults(full_determinism=True, seed=7, ignore_eos=True, repetition_penalty=1.1)
    fields = adapter.request_fields({"stop_token_ids": [5], "stop": ["</s>"], "min_tokens": 2}, 4, limits)
    assert fields["stop_token_ids"] == [5] and fields["stop"] == ["</s>"] and fields["min_tokens"] == 2
    assert fields["seed"] == 7 and fields["ignore_eos"] is True and fields["repetition_penalty"] == 1.1
    assert adapter.request_fields({"seed": 3}, 4, limits)["seed"] == 3
    assert "logprobs" not in fields


@pytest.mark.parametrize("key", ["n", "prompt_logprobs", "logit_bias", "extra_args"])
def test_an_unmapped_parameter_is_refused_by_name(key: str) -> None:
    with pytest.raises(ValueError, match=f"'{key}' is not supported"):
        adapter.request_fields({key: 1}, 4, adapter.RolloutDefaults())


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError):
        adapter.request_fields({"top_p": 0.0}, 4, adapter.RolloutDefaults())
    with pytest.raises(ValueError, match="not both"):
        adapter.request_fields({"max_tokens": 2, "max_new_tokens": 2}, 4, adapter.RolloutDefaults())


def test_settings_come_from_verls_custom_section() -> None:
    config = {
        "actor_rollout_ref": {
            "rollout": {
                "response_length": 64,
                "custom": {
                    "agentspec": {"backends": "http://a:1,http://b:2", "model": "m", "client": {"load_factor": 2.0}}
                },
            }
        }
    }
    client = adapter.AgentspecServerClient.from_verl_config(config)
    assert client.config.backends == ("http://a:1", "http://b:2") and client.config.model == "m"
    assert client.defaults.response_length == 64
    config["actor_rollout_ref"]["rollout"]["custom"]["agentspec"]["backend"] = "typo"  # type: ignore[index]
    with pytest.raises(ValueError, match="unknown setting 'backend'"):
        adapter.AgentspecServerClient.from_verl_config(config)


def test_a_refused_announcement_is_logged_and_training_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    # What the managers do with each new global_steps; port 9 (discard) has no engine.
    client = adapter.AgentspecServerClient(["http://127.0.0.1:9"], "m")
    with caplog.at_level(logging.WARNING, logger="agentspec_rl.verl"):
        assert adapter._announce_quietly(client, 12, keep_old_outputs=False) is False
    assert "could not announce policy version 12" in caplog.text


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed here")
def test_verls_classes_say_what_they_need() -> None:
    with pytest.raises(ImportError, match="needs verl 0.9"):
        adapter.AgentspecAgentLoopManager  # noqa: B018
    with pytest.raises(AttributeError):
        adapter.NoSuchThing  # noqa: B018
