"""vLLM 0.34's suffix method as the replay models it (agentspec.replay.gpu_suffix).

The model against vLLM's own Triton kernels is tests/engine/test_v2_suffix_kernels.py (in the
vLLM 0.34 suite); these pin its behaviour without vLLM.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec.replay.calls import CallSpec
from agentspec.replay.gpu_suffix import SuffixCorpus, VllmSuffixProposer, local_match
from agentspec.replay.proposer import ProposerSettings
from agentspec.replay.registry import make_proposer


def _kernel_local_match(row: list[int], depth: int) -> tuple[int, int]:
    """The local scan kernel's loop, position by position: longest, then latest."""
    n = len(row)
    best = (0, 0)
    for pos in range(1, n):
        length = 0
        for t in range(depth):
            if pos - 1 - t < 0 or n - 1 - t < 0 or row[pos - 1 - t] != row[n - 1 - t]:
                break
            length += 1
        if length and (length, pos) > best:
            best = (length, pos)
    return best


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=0, max_size=60), st.integers(1, 8))
def test_local_match_is_the_kernels_scan(row: list[int], depth: int) -> None:
    assert local_match(np.array(row, dtype=np.int32), depth) == _kernel_local_match(row, depth)


def _call(cid: str) -> CallSpec:
    return CallSpec(call_id=cid, session_id=cid, group_id=cid, trajectory_id=cid, turn=0, source="t")


def _run_call(p: VllmSuffixProposer, cid: str, prompt: list[int], output: list[int]) -> None:
    p.begin_call(_call(cid), np.array(prompt, dtype=np.int32))
    p.observe(cid, np.array(output, dtype=np.int32))
    p.end_call(cid)


def _ctx(tokens: list[int]) -> np.ndarray:
    return np.array(tokens, dtype=np.int32)


def test_drafts_have_fixed_length_padded_with_the_last_token() -> None:
    p = VllmSuffixProposer(depth=24)
    assert p.k == 8  # vLLM 0.34's default: min(8, depth)
    draft = p.propose("a", _ctx([1, 2, 3, 4, 5, 1, 2, 3])).token_ids
    # Own history: "1 2 3" occurred before, continued by 4 5 1 2 3; the rest are filler.
    assert list(draft) == [4, 5, 1, 2, 3, 3, 3, 3]
    assert list(p.propose("a", _ctx([7, 8, 9])).token_ids) == [9] * 8  # no match: all filler
    assert VllmSuffixProposer(depth=4).k == 4


def test_a_finished_response_drafts_for_a_later_request() -> None:
    p = VllmSuffixProposer(depth=24, tokens=4)
    _run_call(p, "first", [50, 51, 52, 10], [11, 12, 13, 14, 15, 16])
    # The corpus holds the prompt's last 3 tokens ahead of the response.
    assert p.held_tokens() == 3 + 6
    draft = p.propose("second", _ctx([90, 91, 52, 10, 11, 12])).token_ids
    assert list(draft) == [13, 14, 15, 16]
    assert p.counters()["steps_drafted_from_corpus"] == 1


def test_the_continuation_stops_at_the_document_end() -> None:
    p = VllmSuffixProposer(depth=24, tokens=6)
    _run_call(p, "first", [1, 2, 3], [20, 21, 22, 23])
    draft = p.propose("b", _ctx([9, 9, 20, 21])).token_ids
    assert list(draft) == [22, 23, 21, 21, 21, 21]  # the separator ends it; filler after


def test_the_vote_picks_the_majority_continuation() -> None:
    p = VllmSuffixProposer(depth=24, tokens=2)
    for i, nxt in enumerate([41, 41, 40]):  # two documents say 41; the newest says 40
        _run_call(p, f"c{i}", [0, 0, 0], [30, 31, 32, nxt])
    assert list(p.propose("q", _ctx([5, 30, 31, 32])).token_ids)[0] == 41
    p2 = VllmSuffixProposer(depth=24, tokens=2)
    for i, nxt in enumerate([41, 40]):  # a tie: the newest document wins
        _run_call(p2, f"c{i}", [0, 0, 0], [30, 31, 32, nxt])
    assert list(p2.propose("q", _ctx([5, 30, 31, 32])).token_ids)[0] == 40


def test_own_history_wins_ties_and_a_longer_corpus_match_wins() -> None:
    p = VllmSuffixProposer(depth=24, tokens=2)
    _run_call(p, "doc", [0, 0, 0], [7, 8, 60, 61])
    # Own history matches "7 8" (2 tokens) as well as the corpus (2 tokens): own wins.
    assert list(p.propose("q", _ctx([7, 8, 70, 71, 7, 8])).token_ids) == [70, 71]
    # The corpus matches "0 7 8" (3 tokens: its prompt tail is indexed), own only "7 8".
    assert list(p.propose("q", _ctx([7, 8, 70, 0, 7, 8])).token_ids) == [60, 61]


def test_the_ring_overwrites_the_oldest_documents() -> None:
    corpus = SuffixCorpus(capacity=16, depth=8, k=3)
    corpus.add(_ctx([1, 2, 3, 4, 5, 6]))  # [0, 6) and a separator at 6
    corpus.add(_ctx([7, 8, 9, 10, 11, 12]))  # [7, 13), separator at 13
    assert corpus.draft(_ctx([2, 3, 4]))[1] == [5, 6]
    corpus.add(_ctx([13, 14, 15, 16, 17]))  # does not fit before 16: wraps to 0
    assert corpus.draft(_ctx([2, 3, 4])) == (0, [])
    assert corpus.draft(_ctx([8, 9, 10]))[1] == [11, 12]
    assert corpus.held == 6 + 5


def test_no_corpus_when_cached_requests_is_zero() -> None:
    p = make_proposer("vllm-suffix", ProposerSettings(suffix_cached_requests=0))
    assert isinstance(p, VllmSuffixProposer) and p.corpus is None
    _run_call(p, "first", [1, 2, 3], [20, 21, 22, 23])
    assert list(p.propose("b", _ctx([9, 9, 20, 21])).token_ids) == [21] * 8


def test_both_releases_are_named_proposers() -> None:
    settings_ = ProposerSettings(suffix_fixed_tokens=5, suffix_corpus_tokens=1024)
    p = make_proposer("vllm-suffix", settings_)
    assert isinstance(p, VllmSuffixProposer) and p.k == 5 and p.corpus is not None and p.corpus.capacity == 1024
    pytest.importorskip("arctic_inference")
    from agentspec.replay.baselines import VllmSuffixTreeProposer

    assert isinstance(make_proposer("vllm-suffix-0.32", settings_), VllmSuffixTreeProposer)
