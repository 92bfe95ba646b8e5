"""The SkyRL adapter's naming, configuration and sampling mapping, without a server or SkyRL."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from agentspec import wire
from agentspec_rl import skyrl
from agentspec_rl.skyrl import (
    AgentspecSessions,
    completion_fields,
    skyrl_overrides,
    trajectory_ids,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "rl" / "skyrl_external_engines.py"


def test_a_prompts_samples_share_a_group_scoped_by_run_and_version() -> None:
    ids = [trajectory_ids(f"42_{r}", run_id="run7", version=3) for r in range(3)]
    assert [i.session_id for i in ids] == ["run7.v3.42/0", "run7.v3.42/1", "run7.v3.42/2"]
    assert {i.group_id for i in ids} == {"run7.v3.42"}
    # The next epoch under a newer policy reuses SkyRL's id but not agentspec's.
    assert trajectory_ids("42_0", run_id="run7", version=4).group_id == "run7.v4.42"
    # A uid with an underscore keeps it: only the last part is the repetition.
    assert trajectory_ids("gsm8k_12_1", run_id="r", version=0).session_id == "r.v0.gsm8k_12/1"


def test_ids_outside_the_alphabet_become_digests_and_lone_ids_are_their_own_group() -> None:
    odd = trajectory_ids("what is 2+2?_1", run_id="r", version=0)
    assert odd.group_id.startswith("r.v0.h") and odd.session_id == odd.group_id + "/1"
    long = trajectory_ids("x" * 300 + "_0", run_id="r" * 24, version=10**6)
    for i in (odd, long):
        assert wire.is_valid_id(i.session_id) and len(i.session_id) <= 128
    lone = trajectory_ids("0f3a9c", run_id="r", version=0)
    assert lone.session_id == lone.group_id == "r.v0.0f3a9c"


def test_sampling_dict_becomes_completion_fields() -> None:
    fields = completion_fields({"max_tokens": 8, "stop": None, "logprobs": 1, "n": 1, "min_p": 0.0})
    assert fields == {"max_tokens": 8, "logprobs": 1, "min_p": 0.0}
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        completion_fields({"n": 4})


def test_overrides_point_skyrl_at_the_engines() -> None:
    assert skyrl_overrides(["http://gpu1:8001/", "http://gpu2:8001"], served_model_name="policy") == [
        "generator.inference_engine.run_engines_locally=false",
        "generator.inference_engine.external_server_urls=['http://gpu1:8001','http://gpu2:8001']",
        "generator.inference_engine.served_model_name='policy'",
    ]
    assert (
        skyrl_overrides(["http://a:1"], proxy_url="http://r:9")[-1]
        == "generator.inference_engine.external_proxy_url='http://r:9'"
    )
    for bad in ([], ["gpu1:8001"]):
        with pytest.raises(ValueError):
            skyrl_overrides(bad)


def test_sessions_check_the_run_id_and_pickle_without_connections() -> None:
    with pytest.raises(ValueError, match="run_id"):
        AgentspecSessions(["http://a:1"], run_id="a b")
    s = AgentspecSessions(["http://a:1"], "tiny", keep_old_outputs=True)
    copy = pickle.loads(pickle.dumps(s))
    assert (copy.run_id, copy.keep_old_outputs, copy.config.backends) == (s.run_id, True, ("http://a:1",))


@pytest.mark.skipif(importlib.util.find_spec("skyrl") is not None, reason="SkyRL is installed here")
def test_the_skyrl_client_says_it_needs_skyrl() -> None:
    with pytest.raises(ImportError, match="needs SkyRL: pip install"):
        skyrl.AgentspecInferenceClient  # noqa: B018


def test_the_example_explains_itself_without_skyrl() -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, check=True)
    assert "--engines" in out.stdout
    printed = subprocess.run(
        [sys.executable, str(EXAMPLE), "--engines", "http://gpu1:8001", "--print-overrides"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "generator.inference_engine.external_server_urls=['http://gpu1:8001']" in printed.stdout
