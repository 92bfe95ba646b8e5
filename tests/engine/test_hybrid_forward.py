"""Hybrid drafting with a real small draft model (the tiny target's first two layers) and
with an EAGLE head (one layer on the target's hidden states, random weights).

The draft model's forward passes are counted by wrapping the model itself in an offline
vLLM engine (``hybrid_probe.py``, in its own process), not by agentspec's counters: a step
where every request takes the index's draft must run the draft model once (its first pass,
which keeps its KV cache current), and a step where some request takes the model's draft
runs it ``num_tokens`` times. Greedy outputs must equal plain vLLM's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from engine_helpers import PROMPTS, completion_ok

from agentspec.testing.pytest_plugin import server_python

pytestmark = pytest.mark.server

PROBE = Path(__file__).with_name("hybrid_probe.py")
NUM_TOKENS = 4


def _build(builder: str, target: Path) -> Path:
    code = f"import sys; from agentspec.testing.tiny_model import {builder}; print({builder}(sys.argv[1]))"
    out = subprocess.run(
        [server_python() or sys.executable, "-c", code, str(target)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return Path(out.stdout.strip().splitlines()[-1])


def _tokens(base: str, text: str) -> list[int]:
    r = httpx.post(
        base + "/tokenize", json={"model": "tiny", "prompt": text}, timeout=30
    )
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


@pytest.mark.parametrize(
    ("method", "builder"),
    [("draft_model", "build_tiny_drafter"), ("eagle", "build_tiny_eagle_head")],
    ids=["draft-model", "eagle"],
)
def test_drafter_passes_follow_the_paths_and_outputs_equal_plain_vllm(
    plain_server, tiny_model_dir: Path, tmp_path: Path, method: str, builder: str
) -> None:
    drafter = _build(builder, tiny_model_dir)
    # Prompts that repeat themselves (the index drafts their next copy) and one that
    # does not (only the model can draft it); fewer than the batch budget's full size.
    texts = [p * 3 for p in PROMPTS[:4]] + [PROMPTS[4]]
    prompts = [_tokens(plain_server.url, t) for t in texts]
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "prompts": prompts,
                "max_tokens": 48,
                "num_tokens": NUM_TOKENS,
                "method": method,
            }
        )
    )
    result_path = tmp_path / "result.json"
    run = subprocess.run(
        [
            server_python() or sys.executable,
            str(PROBE),
            str(tiny_model_dir),
            str(drafter),
            str(request),
            str(result_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(result_path.read_text())
    assert (
        result["proposer"]
        == {"draft_model": "HybridProposer", "eagle": "HybridEagleProposer"}[method]
    )

    reference = [
        completion_ok(plain_server.url, p, max_tokens=48)["choices"][0]["token_ids"]
        for p in prompts
    ]
    assert result["outputs"] == reference

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
    assert engine["suffix_drafts_total"] > 0 and engine["model_drafts_total"] > 0, (
        engine
    )
