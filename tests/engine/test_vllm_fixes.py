"""The stand-in for vLLM's ``expand_batch_to_tokens`` (agentspec.engine.vllm_fixes)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="the fix is for vLLM's torch tensors")

from agentspec.engine.vllm.fixes import expand_batch_to_tokens


def test_by_hand() -> None:
    # vLLM's docstring example: x = [a, b, c], cu_num_tokens = [2, 5, 6].
    out = expand_batch_to_tokens(
        torch.tensor([0.7, -1.0, 2.0]),
        torch.tensor([2, 5, 6], dtype=torch.int32),
        6,
        -1,
        1,
    )
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 2.0])
    ints = expand_batch_to_tokens(torch.tensor([5, 0, 7]), torch.tensor([1, 1, 3]), 3)
    assert ints.tolist() == [5, 7, 7]  # a request without tokens contributes none


@given(st.lists(st.tuples(st.floats(0.1, 4.0), st.integers(0, 5)), min_size=1, max_size=12))
def test_matches_numpy_repeat(rows: list[tuple[float, int]]) -> None:
    values = np.array([v for v, _ in rows], dtype=np.float32)
    counts = np.array([n for _, n in rows])
    out = expand_batch_to_tokens(torch.from_numpy(values), torch.from_numpy(np.cumsum(counts)), int(counts.sum()))
    assert out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), np.repeat(values, counts))
