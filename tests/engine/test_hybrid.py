"""Hybrid drafting through a real ``agentspec serve --agentspec-drafter`` (vLLM's
draft_model method with the session draft index beside it), against plain vLLM.

The server's draft model is the tiny target itself: a drafter that always agrees with the
target, so every model draft must be accepted in full. A fault in the draft KV cache (e.g.
after steps whose draft passes were skipped) would show as a rejected model draft. What
this cannot show is a drafter's speed-up: on this model both drafters cost about what the
target does.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from engine_helpers import (
    PROMPTS,
    chat_ok,
    completion_ok,
    idle_stats,
    server_stats,
    session_stats,
)

from agentspec.testing.sampling import tv_permutation_p
from agentspec.testing.stats import metric_value

pytestmark = pytest.mark.server

PATHS = ("suffix", "model", "none")
KEYS = [f"{p}_{k}" for p in PATHS for k in ("drafts_total", "draft_tokens_total", "accepted_tokens_total")] + [
    "drafter_runs_total",
    "drafter_runs_skipped_total",
]


def _engine(base: str) -> dict[str, float]:
    return {k: server_stats(base)["engine"].get(k, 0) for k in KEYS}


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in KEYS}


def _session(base: str, session: str, first: str, turns: int) -> list[list[int]]:
    """A multi-turn chat whose later turns repeat the session's earlier text."""
    messages = [{"role": "user", "content": first}]
    outputs = []
    for turn in range(turns):
        resp = chat_ok(base, messages, max_tokens=48, headers={"X-Session-Id": session})
        outputs.append(resp["choices"][0]["token_ids"])
        messages += [
            {"role": "assistant", "content": resp["choices"][0]["message"]["content"]},
            {"role": "user", "content": f"Again, step {turn}: {first}"},
        ]
    return outputs


def test_greedy_outputs_equal_plain_vllm_over_concurrent_sessions(agentspec_hybrid_server, plain_server) -> None:
    firsts = PROMPTS[:4]

    def run(base: str, i: int) -> list[list[int]]:
        return _session(base, f"hy-{base[-5:]}-{i}", firsts[i], turns=3)

    with ThreadPoolExecutor(4) as pool:
        ours = list(pool.map(lambda i: run(agentspec_hybrid_server.url, i), range(len(firsts))))
        ref = list(pool.map(lambda i: run(plain_server.url, i), range(len(firsts))))
    for first, a, b in zip(firsts, ours, ref, strict=True):
        assert a == b, f"a session starting {first!r} differs from plain vLLM"


def _repeating_session(base: str, session: str, first: str, turns: int) -> list[list[int]]:
    """An agent loop whose every prompt holds the previous prompt and output and then the
    first prompt again, so the model's next output repeats text the session holds."""
    prompt, outputs = first, []
    for _ in range(turns):
        resp = completion_ok(base, prompt, max_tokens=64, headers={"X-Session-Id": session})
        outputs.append(resp["choices"][0]["token_ids"])
        prompt = prompt + resp["choices"][0]["text"] + "\n# again\n" + first
    return outputs


def test_one_session_takes_both_paths_and_skips_the_drafter(agentspec_hybrid_server, plain_server) -> None:
    base = agentspec_hybrid_server.url
    idle_stats(base)
    before = _engine(base)
    # One request at a time, so every step's batch is this session's request alone.
    ours = _repeating_session(base, "hy-both", PROMPTS[5], turns=4)
    assert ours == _repeating_session(plain_server.url, "hy-both", PROMPTS[5], turns=4)
    idle_stats(base)
    d = _delta(before, _engine(base))
    # Where the session repeats itself the index drafts; elsewhere the model does.
    assert d["suffix_drafts_total"] > 0 and d["suffix_accepted_tokens_total"] > 0, d
    assert d["model_drafts_total"] > 0, d
    # Steps where the index's draft was taken ran only the drafter's first pass.
    assert d["drafter_runs_skipped_total"] > 0, d
    assert d["drafter_runs_total"] + d["drafter_runs_skipped_total"] >= d["model_drafts_total"], d
    # The drafter agrees with the target: every model draft is accepted in full, also
    # after skipped draft passes, so the draft KV cache stayed right.
    assert d["model_accepted_tokens_total"] == d["model_draft_tokens_total"] > 0, d
    # The session's own statistics split the same drafts by drafter.
    stats = session_stats(base, "hy-both")
    assert stats is not None and stats["calls"] == 4
    assert stats["model_draft_steps"] > 0 and stats["model_accepted_tokens"] == stats["model_draft_tokens"] > 0
    assert stats["draft_steps"] > 0 and stats["accepted_tokens"] > 0


def test_paths_switch_inside_one_request(agentspec_hybrid_server, plain_server) -> None:
    """One call, alone in its session: the index drafts where its output repeats the
    prompt, the model where it does not, and the output is plain vLLM's."""
    first = PROMPTS[3]
    # The model's own continuation of ``first`` (from the reference server, so the
    # hybrid's session sees this one call only), then ``first`` again: the call's output
    # tends to repeat that continuation, and to leave it.
    earlier = completion_ok(plain_server.url, first, max_tokens=64)["choices"][0]["text"]
    prompt = first + earlier + "\n# again\n" + first
    base = agentspec_hybrid_server.url
    ours = completion_ok(base, prompt, max_tokens=96, headers={"X-Session-Id": "hy-one-call"})
    ref = completion_ok(plain_server.url, prompt, max_tokens=96)
    assert ours["choices"][0]["token_ids"] == ref["choices"][0]["token_ids"]
    idle_stats(base)
    stats = session_stats(base, "hy-one-call")
    assert stats is not None and stats["calls"] == 1, stats
    # Both drafters drafted steps of this one request, and every model draft was
    # accepted in full (the drafter agrees with the target) around the index's drafts.
    assert stats["draft_steps"] > 0 and stats["accepted_tokens"] > 0, stats
    assert stats["model_draft_steps"] > 0, stats
    assert stats["model_accepted_tokens"] == stats["model_draft_tokens"] > 0, stats


def test_concurrent_requests_mix_paths_in_one_batch(agentspec_hybrid_server, plain_server) -> None:
    """Several requests per step, some on the index's draft and some on the model's."""
    base = agentspec_hybrid_server.url
    prompts = [p * 2 for p in PROMPTS[6:12]]

    def run(url: str, p: str) -> list[int]:
        return completion_ok(url, p, max_tokens=40)["choices"][0]["token_ids"]

    with ThreadPoolExecutor(6) as pool:
        ours = list(pool.map(lambda p: run(base, p), prompts))
        ref = list(pool.map(lambda p: run(plain_server.url, p), prompts))
    assert ours == ref
    stats = server_stats(base)["engine"]
    assert stats.get("model_accepted_tokens_total") == stats.get("model_draft_tokens_total")


def _accepted_both_ways(base: str) -> tuple[float, float]:
    """vLLM's own count of accepted draft tokens, and the two paths' together (zero
    both before the engine's first step, when nothing is published yet)."""
    engine = idle_stats(base)["engine"] if server_stats(base)["workers"] else {}
    ours = engine.get("suffix_accepted_tokens_total", 0) + engine.get("model_accepted_tokens_total", 0)
    vllm = metric_value(httpx.get(base + "/metrics").text, "vllm:spec_decode_num_accepted_tokens_total")
    return vllm, ours


def test_paths_and_drafter_on_metrics(agentspec_hybrid_server) -> None:
    base = agentspec_hybrid_server.url
    # Over this test's request alone: the server's totals include the concurrent tests'.
    vllm_before, ours_before = _accepted_both_ways(base)
    chat_ok(
        base,
        [{"role": "user", "content": PROMPTS[2] * 2}],
        max_tokens=32,
        headers={"X-Session-Id": "hy-m"},
    )
    idle_stats(base)
    engine = server_stats(base)["engine"]
    text = httpx.get(base + "/metrics").text
    for path in ("suffix", "model"):
        exported = metric_value(text, "agentspec_path_drafts_total", f'path="{path}"')
        assert exported == engine[f"{path}_drafts_total"] > 0
    assert metric_value(text, "agentspec_drafter_runs_total") == engine["drafter_runs_total"]
    assert metric_value(text, "agentspec_drafter_runs_skipped_total") == engine["drafter_runs_skipped_total"]
    # vLLM's own count of accepted draft tokens is the two paths' together.
    vllm_after, ours_after = _accepted_both_ways(base)
    assert vllm_after - vllm_before == ours_after - ours_before > 0


def _samples(base: str, prompt: str, requests: int = 8, n: int = 50) -> list[list[int]]:
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 1.0,
        "n": n,
        "return_token_ids": True,
    }
    out: list[list[int]] = []
    for _ in range(requests):
        # One session: sibling samples draft for each other, as an RL group's do.
        r = httpx.post(
            base + "/v1/completions",
            json=body,
            headers={"X-Session-Id": "hy-sampling"},
            timeout=300,
        )
        assert r.status_code == 200, r.text
        out += [c["token_ids"] for c in r.json()["choices"]]
    return out


SAMPLED_SERVERS = [
    "agentspec_hybrid_server",
    # An EAGLE-3 head as train-drafter writes it, whose drafts over a reduced vocabulary
    # (d2t) vLLM samples.
    "agentspec_hybrid_sampled_server",
    "agentspec_server",
]


# Each case declares only its own server: the run keeps one of them alive at a time.
@pytest.mark.parametrize("server", [pytest.param(s, marks=pytest.mark.server(s)) for s in SAMPLED_SERVERS])
def test_sampled_outputs_keep_the_targets_distribution(request, plain_server, server: str) -> None:
    """At temperature 1, tokens at drafted positions are distributed as plain vLLM's.

    (vLLM 0.32's CPU backend fails this for every speculative method unless
    agentspec.engine.vllm_fixes is applied: its rejection sampler used an arbitrary
    temperature; the distance was about 0.5 here.)
    """
    base = request.getfixturevalue(server).url
    prompt = PROMPTS[7] * 3  # repeats itself: the index drafts at most steps
    text = httpx.get(base + "/metrics").text
    drafted0 = metric_value(text, "vllm:spec_decode_num_draft_tokens_total")
    accepted0 = metric_value(text, "vllm:spec_decode_num_accepted_tokens_total")
    paths0 = _engine(base)
    ours, ref = _samples(base, prompt), _samples(plain_server.url, prompt)
    if server != "agentspec_server":
        # Both drafters drafted under sampling (with probabilistic draft sampling, the
        # index's rows carried one-hot probabilities next to the model's).
        idle_stats(base)
        d = _delta(paths0, _engine(base))
        assert d["suffix_drafts_total"] > 0 and d["model_drafts_total"] > 0, d
    text = httpx.get(base + "/metrics").text
    drafted = metric_value(text, "vllm:spec_decode_num_draft_tokens_total") - drafted0
    accepted = metric_value(text, "vllm:spec_decode_num_accepted_tokens_total") - accepted0
    # Drafts were verified under sampling, and sampling rejected some of them.
    assert drafted > 500 and 0 < accepted < drafted
    for pos in (1, 2, 4):  # position 0 is the prefill's token: nothing drafts it
        a = [o[pos] for o in ours if len(o) > pos]
        b = [o[pos] for o in ref if len(o) > pos]
        assert max(np.bincount(np.unique(b, return_inverse=True)[1])) < 0.5 * len(b)  # not near-greedy
        distance, p = tv_permutation_p(a, b)
        assert p > 0.001, f"position {pos}: distance {distance:.3f} between samples, p={p:.4f}"
