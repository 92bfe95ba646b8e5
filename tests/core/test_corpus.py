"""Corpus bookkeeping over the native suffix tree."""

from __future__ import annotations

import numpy as np

from agentspec.index.corpus import Corpus


def _tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 5000, n).astype(np.int32)


def test_memory_estimate_follows_the_tree_without_walking_it_every_time() -> None:
    rng = np.random.default_rng(0)
    corpus = Corpus(max_depth=16)
    seq = corpus.new_sequence()
    corpus.extend(seq, _tokens(rng, 10_000))
    first = corpus.memory_bytes()
    assert first == corpus.memory_bytes(exact=True) > 0

    # A small change is scaled from the last measurement, not measured.
    corpus.extend(seq, _tokens(rng, 500))
    assert corpus.memory_bytes() == first * 10_500 // 10_000

    # Past the re-measure threshold the estimate is the tree's own figure again.
    corpus.extend(seq, _tokens(rng, 2_000))
    exact = corpus.memory_bytes(exact=True)
    assert corpus.memory_bytes() == exact > first

    # Shrinking is followed too.
    freed = corpus.drop_oldest()
    assert freed == 12_500 and corpus.tokens == 0
    assert corpus.memory_bytes() == corpus.memory_bytes(exact=True) < first
