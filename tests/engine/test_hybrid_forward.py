"""Hybrid drafting with a real small draft model (the tiny target's first two layers),
with an EAGLE head (one layer on the target's hidden states, random weights) and with an
EAGLE-3 head (one layer on three of the target's layers' hidden states, random weights).

The draft model's forward passes are counted by wrapping the model itself in an offline
vLLM engine (``tests/hybrid_probe.py``, in its own process), not by agentspec's counters: a step
where every request takes the index's draft must run the draft model once (its first pass,
which keeps its KV cache current), and a step where some request takes the model's draft
runs it ``num_tokens`` times. Greedy outputs must equal plain vLLM's. The same holds
under vLLM's own batch-size schedule (``num_speculative_tokens_per_batch_size``): where it
allows no draft, the draft model runs its first pass only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_helpers import PROMPTS, completion_ok
from hybrid_probe import run_hybrid_probe

from agentspec.testing.pytest_plugin import server_python
from agentspec.testing.server_kinds import build_with_server_python

pytestmark = pytest.mark.server

NUM_TOKENS = 4


def _tokens(base: str, text: str) -> list[int]:
    r = httpx.post(base + "/tokenize", json={"model": "tiny", "prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def _probe(target: Path, drafter: Path, tmp_path: Path, request: dict[str, Any]) -> dict[str, Any]:
    """Run the hybrid probe on ``request`` and return its result."""
    return run_hybrid_probe(target, drafter, {"num_tokens": NUM_TOKENS, **request}, tmp_path, server_python())


def _reference(base: str, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    return [
        completion_ok(base, p, max_tokens=n)["choices"][0]["token_ids"]
        for p, n in zip(prompts, max_tokens, strict=True)
    ]


@pytest.mark.parametrize(
    ("method", "builder", "proposer", "drafter_model"),
    [
        ("draft_model", "build_tiny_drafter", "HybridProposer", "LlamaForCausalLM"),
        ("eagle", "build_tiny_eagle_head", "HybridEagleProposer", "EagleLlamaForCausalLM"),
        ("eagle3", "build_tiny_eagle3_head", "HybridEagleProposer", "Eagle3LlamaForCausalLM"),
    ],
    ids=["draft-model", "eagle", "eagle3"],
)
def test_drafter_passes_follow_the_paths_and_outputs_equal_plain_vllm(
    plain_server,
    tiny_model_dir: Path,
    tmp_path: Path,
    method: str,
    builder: str,
    proposer: str,
    drafter_model: str,
) -> None:
    drafter = build_with_server_python(builder, tiny_model_dir)
    # Prompts that repeat themselves (the index drafts their next copy) and one that
    # does not (only the model can draft it); fewer than the batch budget's full size.
    texts = [p * 3 for p in PROMPTS[:4]] + [PROMPTS[4]]
    prompts = [_tokens(plain_server.url, t) for t in texts]
    result = _probe(
        tiny_model_dir,
        drafter,
        tmp_path,
        {"prompts": prompts, "max_tokens": 48, "method": method},
    )
    assert (result["proposer"], result["drafter_model"]) == (proposer, drafter_model)
    assert result["outputs"] == _reference(plain_server.url, prompts, [48] * len(prompts))

    engine = result["engine"]
    runs, skipped = (
        engine.get("drafter_runs_total", 0),
        engine.get("drafter_runs_skipped_total", 0),
    )
    assert runs > 0 and skipped > 0, engine
    assert result["propose"] == runs + skipped
    # One pass per step, and NUM_TOKENS - 1 more on steps that ran the drafter's draft passes.
    assert result["forward"] == result["propose"] + (NUM_TOKENS - 1) * runs, (
        result["forward"],
        engine,
    )
    assert engine["suffix_drafts_total"] > 0 and engine["model_drafts_total"] > 0, engine
    # Step by step: the first pass alone, or all NUM_TOKENS passes.
    assert {forwards for _, forwards, _ in result["calls"]} == {1, NUM_TOKENS}


def test_vllms_batch_size_schedule_caps_the_hybrid(plain_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    """vLLM's ``num_speculative_tokens_per_batch_size`` composes with agentspec's budget:
    here 8 tokens for a request alone and none for two or more. Where it allows none, no
    request drafts and the draft model runs only its first pass (which keeps its KV
    cache current for later steps)."""
    drafter = build_with_server_python("build_tiny_drafter", tiny_model_dir)
    texts = [p * 3 for p in PROMPTS[:4]]
    prompts = [_tokens(plain_server.url, t) for t in texts]
    # The last request runs on alone once the others are done: drafts resume then.
    max_tokens = [24, 24, 24, 96]
    schedule = [[1, 1, 8], [2, 32, 0]]
    result = _probe(
        tiny_model_dir,
        drafter,
        tmp_path,
        {
            "prompts": prompts,
            "max_tokens": max_tokens,
            "speculative_config": {"num_speculative_tokens_per_batch_size": schedule},
        },
    )
    assert result["outputs"] == _reference(plain_server.url, prompts, max_tokens)
    calls = result["calls"]
    assert {allowed for allowed, _, _ in calls} == {0, 8}, calls
    none_allowed = [(forwards, longest) for allowed, forwards, longest in calls if allowed == 0]
    assert none_allowed and set(none_allowed) == {(1, 0)}, none_allowed
    alone = [longest for allowed, _, longest in calls if allowed == 8]
    assert max(alone) > 0 and max(alone) <= 8, alone
    engine = result["engine"]
    assert engine["suffix_drafts_total"] > 0, engine
