"""The batch-aware draft budget rule (agentspec.engine.budget)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentspec.draft_budget.batch_budget import BatchBudget


def test_documented_rule() -> None:
    b = BatchBudget(32, full_batch=8, off_batch=64)
    assert [b.tokens_for(n) for n in (1, 8, 9, 16, 17, 32, 33, 64, 65, 1000)] == [32, 32, 16, 16, 8, 8, 4, 4, 0, 0]


@given(st.integers(0, 64), st.integers(1, 32), st.integers(0, 64), st.integers(1, 4096))
def test_monotone_and_bounded(k: int, full: int, extra: int, n: int) -> None:
    b = BatchBudget(k, full_batch=full, off_batch=full + extra)
    assert 0 <= b.tokens_for(n) <= k
    assert b.tokens_for(n + 1) <= b.tokens_for(n)
    if n > full + extra:
        assert b.tokens_for(n) == 0


def test_bad_rule_refused() -> None:
    with pytest.raises(ValueError):
        BatchBudget(8, full_batch=16, off_batch=8)
