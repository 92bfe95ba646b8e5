"""Whether two samples of tokens come from one distribution: for tests that check sampled
speculative decoding keeps the target model's distribution."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["tv_permutation_p"]


def tv_permutation_p(a: Sequence[int], b: Sequence[int], rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Total variation distance between two samples' distributions and its permutation
    p-value: the chance of a distance at least as large if both came from one distribution
    (at least ``1 / (rounds + 1)``)."""
    if not a or not b:
        raise ValueError("both samples need at least one token")
    cats = {t: i for i, t in enumerate(sorted(set(a) | set(b)))}
    pooled = np.array([cats[t] for t in [*a, *b]])
    k = len(cats)

    def tv(x: np.ndarray) -> float:
        pa = np.bincount(x[: len(a)], minlength=k) / len(a)
        pb = np.bincount(x[len(a) :], minlength=k) / len(b)
        return 0.5 * float(np.abs(pa - pb).sum())

    observed = tv(pooled)
    rng = np.random.default_rng(seed)
    hits = sum(tv(rng.permutation(pooled)) >= observed for _ in range(rounds))
    return observed, (hits + 1) / (rounds + 1)
