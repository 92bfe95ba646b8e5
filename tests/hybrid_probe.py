"""Runs hybrid drafting in one process (vLLM's offline ``LLM``) and counts the draft
model's forward passes by wrapping the model itself, not through agentspec's counters.

    python tests/hybrid_probe.py TARGET DRAFTER REQUEST.json RESULT.json

or from a test, :func:`run_hybrid_probe` (``from hybrid_probe import run_hybrid_probe``:
``tests/`` is on the tests' path). It is a test's tool, not the package's: only
``agentspec.engine.vllm`` imports vLLM there.

REQUEST.json: ``{"prompts": [[token ids], ...], "max_tokens": N or [N per prompt],
"num_tokens": K, "method": "draft_model" | "eagle" | "eagle3", "speculative_config": {more
keys, optional}}``.
RESULT.json gets the proposer's and the draft model's classes, the greedy outputs (token
ids), the forward passes of the draft model, the proposer's calls (and per call: the draft
length vLLM allowed, the forward passes, the longest draft returned), and the proposer's
own counters (``tests/engine/test_hybrid_forward.py``, ``tests/training/``). A separate
process because the engine runs in it (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), with
agentspec's plugin on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_hybrid_probe(
    target: Path, drafter: Path | str, request: dict[str, Any], workdir: Path, python: str | None = None
) -> dict[str, Any]:
    """Run the probe on ``request`` in a process of its own (``python``: the interpreter
    with vLLM, default this one) and return its result; AssertionError with its output's
    tail when it fails."""
    request_path = workdir / "probe-request.json"
    request_path.write_text(json.dumps(request))
    result_path = workdir / "probe-result.json"
    run = subprocess.run(
        [
            python or sys.executable,
            str(Path(__file__)),
            str(target),
            str(drafter),
            str(request_path),
            str(result_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result


def main(target: str, drafter: str, request_path: str, result_path: str) -> None:
    request = json.loads(open(request_path).read())  # noqa: SIM115 - a test helper
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from agentspec.engine.launcher.serve import hybrid_speculative_config
    from agentspec.engine.settings import ENV_CONFIG, DrafterSettings, EngineSettings

    drafter_settings = DrafterSettings(
        model=drafter,
        num_tokens=request["num_tokens"],
        method=request.get("method", "draft_model"),
    )
    # The fixed batch rule: the probe counts the drafter's passes per path, which the cost
    # budget would rightly price out for a drafter this large beside the target on a CPU.
    os.environ[ENV_CONFIG] = EngineSettings(drafter=drafter_settings, draft_budget="batch").to_env()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=target,
        dtype="float32",
        enforce_eager=True,
        max_model_len=2048,
        max_num_seqs=32,
        async_scheduling=False,
        speculative_config={
            **hybrid_speculative_config(drafter_settings),
            **request.get("speculative_config", {}),
        },
    )
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    proposer = runner.drafter
    counts = {"forward": 0, "propose": 0}
    calls: list[list[int]] = []  # per propose call: [allowed length, forwards, longest draft]

    model = proposer.model
    forward = model.forward

    def counted_forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts["forward"] += 1
        return forward(*args, **kwargs)

    model.forward = counted_forward
    propose = proposer.propose

    def counted_propose(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts["propose"] += 1
        forwards = counts["forward"]
        drafts = propose(*args, **kwargs)
        allowed = kwargs.get("num_speculative_tokens", args[0] if args else -1)
        longest = max((len(d) for d in drafts), default=0)
        calls.append([int(allowed), counts["forward"] - forwards, longest])
        return drafts

    proposer.propose = counted_propose
    max_tokens = request["max_tokens"]
    if isinstance(max_tokens, int):
        max_tokens = [max_tokens] * len(request["prompts"])
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in max_tokens]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in request["prompts"]], params)
    result = {
        "proposer": type(proposer).__name__,
        "drafter_model": type(model).__name__,
        "outputs": [list(o.outputs[0].token_ids) for o in outputs],
        "forward": counts["forward"],
        "propose": counts["propose"],
        "calls": calls,
        "engine": dict(proposer.driver.counters),
    }
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
