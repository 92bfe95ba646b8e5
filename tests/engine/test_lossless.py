"""Speculation never changes results: with temperature 0, ``agentspec serve`` gives
token-for-token the outputs of the same model served by plain vLLM without speculation,
for many concurrent prompts and for multi-turn sessions, with and without seeds."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from engine_helpers import PROMPTS, chat_ok, completion_ok

from agentspec.testing.stats import metric_value

pytestmark = pytest.mark.server


def _ids(resp: dict[str, Any]) -> list[int]:
    return resp["choices"][0]["token_ids"]


def test_many_prompts_concurrently(agentspec_server, plain_server) -> None:
    def run(base: str, i: int, p: str) -> list[int]:
        return _ids(chat_ok(base, [{"role": "user", "content": p}], max_tokens=64, headers={"X-Session-Id": f"ll-{i}"}))

    with ThreadPoolExecutor(8) as pool:
        ours = list(pool.map(lambda ip: run(agentspec_server.url, *ip), enumerate(PROMPTS)))
        ref = list(pool.map(lambda ip: run(plain_server.url, *ip), enumerate(PROMPTS)))
    for prompt, a, b in zip(PROMPTS, ours, ref, strict=True):
        assert a == b, f"output differs for {prompt!r}"
    # Speculation really happened (else the comparison proves nothing).
    text = httpx.get(agentspec_server.url + "/metrics").text
    assert metric_value(text, "vllm:spec_decode_num_accepted_tokens_total") > 100


def _multi_turn(base: str, session: str, first: str, turns: int, seeds: list[dict[str, Any]] | None) -> list[list[int]]:
    messages = [{"role": "user", "content": first}]
    outputs = []
    for turn in range(turns):
        extra: dict[str, Any] = {"agentspec_seeds": seeds} if seeds and turn == 0 else {}
        resp = chat_ok(base, messages, max_tokens=40, headers={"X-Session-Id": session}, **extra)
        outputs.append(_ids(resp))
        messages += [
            {"role": "assistant", "content": resp["choices"][0]["message"]["content"]},
            {"role": "user", "content": f"Observation {turn}: {PROMPTS[(turn * 5) % len(PROMPTS)]}"},
        ]
    return outputs


@pytest.mark.parametrize("seeded", [False, True], ids=["no-seeds", "seeds"])
def test_multi_turn_sessions(agentspec_server, plain_server, seeded: bool) -> None:
    firsts = PROMPTS[:4] if not seeded else PROMPTS[4:8]

    def seeds_for(i: int) -> list[dict[str, Any]] | None:
        if not seeded:
            return None
        # A seed that is relevant (another prompt's text) and one that is noise.
        return [
            {"text": PROMPTS[(i + 9) % len(PROMPTS)] * 3, "kind": "document"},
            {"token_ids": list(range(100, 164)), "scope": "group", "kind": "sibling_output"},
        ]

    with ThreadPoolExecutor(4) as pool:
        ours = list(
            pool.map(
                lambda i: _multi_turn(agentspec_server.url, f"mt-{seeded}-{i}", firsts[i], 4, seeds_for(i)), range(4)
            )
        )
        ref = list(pool.map(lambda i: _multi_turn(plain_server.url, f"mt-{seeded}-{i}", firsts[i], 4, None), range(4)))
    assert ours == ref


def test_completions_token_prompts(agentspec_server, plain_server) -> None:
    """The /v1/completions path with token-id prompts (what RL rollout workers send)."""
    prompts = [[(7 * i + j * 13) % 4000 + 50 for j in range(40)] for i in range(6)]
    for i, p in enumerate(prompts):
        a = completion_ok(agentspec_server.url, p, max_tokens=48, vllm_xargs={"session_id": f"tok-{i}"})
        b = completion_ok(plain_server.url, p, max_tokens=48)
        assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
