"""vllm-ngram: the numpy implementation must give exactly vLLM's drafts."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec.replay.ngram import ngram_draft_numpy


def _vllm_reference():
    """vLLM's own ngram function, run as plain Python (importing vLLM takes seconds)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "v1" / "spec_decode" / "ngram_proposer.py"
    tree = ast.parse(path.read_text())
    fn = next(
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "_find_longest_matched_ngram_and_propose_tokens"
    )
    fn.decorator_list = []  # drop numba's @jit: same algorithm, interpreted
    namespace: dict[str, object] = {"np": np}
    exec(compile(ast.Module([fn], []), str(path), "exec"), namespace)  # noqa: S102
    return namespace[fn.name]


@pytest.fixture(scope="module")
def vllm_ngram():
    return _vllm_reference()


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), max_size=40),
    min_n=st.integers(1, 3),
    extra=st.integers(0, 3),
    k=st.integers(1, 9),
)
def test_numpy_equals_vllm(vllm_ngram, tokens: list[int], min_n: int, extra: int, k: int) -> None:
    ctx = np.asarray(tokens, dtype=np.int32)
    want = vllm_ngram(ctx, min_n, min_n + extra, 1 << 40, k)
    got = ngram_draft_numpy(ctx, min_n, min_n + extra, k)
    assert got.tolist() == want.tolist()


def test_examples() -> None:
    ctx = np.asarray([1, 2, 3, 4, 9, 1, 2, 3, 4, 7, 1, 2, 3], dtype=np.int32)
    # "1 2 3" (n=3) first occurs at 0: draft what follows it.
    assert ngram_draft_numpy(ctx, 2, 5, 3).tolist() == [4, 9, 1]
    assert ngram_draft_numpy(ctx, 4, 5, 3).tolist() == []  # "7 1 2 3" never occurred before: no draft
    assert ngram_draft_numpy(np.asarray([5], dtype=np.int32), 1, 2, 3).tolist() == []
