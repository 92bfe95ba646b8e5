"""vLLM's n-gram (prompt lookup) drafting algorithm.

vLLM 0.32 (``vllm/v1/spec_decode/ngram_proposer.py``) finds the longest n-gram,
``prompt_lookup_min <= n <= prompt_lookup_max``, that ends the context and also
occurs earlier in it (the occurrence must end before the last token); among
occurrences of that longest n it takes the earliest, and drafts the (at most k)
tokens that follow it. vLLM runs a numba KMP over the reversed context.
:func:`ngram_draft_numpy` computes the same result with a few vectorised passes
over the candidate positions, without numba or vLLM; :func:`ngram_drafter`
returns vLLM's own function when vLLM is importable.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: (context, min_n, max_n, k) -> draft tokens
NgramFn = Callable[[np.ndarray, int, int, int], np.ndarray]

_EMPTY = np.zeros(0, dtype=np.int32)
#: vLLM also caps k by ``max_model_len - len(context)``; the replay has no model length.
_NO_MODEL_LEN_LIMIT = 1 << 40


def ngram_draft_numpy(context: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """Same result as vLLM's ``_find_longest_matched_ngram_and_propose_tokens``."""
    n_tok = context.shape[0]
    if n_tok < min_n or n_tok < 2 or k <= 0:
        return _EMPTY
    # Candidate end positions e (< n_tok - 1) of earlier occurrences of the last
    # 1, 2, ... tokens: filter the candidate set one token further back each round.
    cand = np.flatnonzero(context[: n_tok - 1] == context[n_tok - 1])
    length = 1
    best_end = -1
    while cand.size:
        if length >= min_n:
            best_end = int(cand[0])  # earliest occurrence of the longest n so far
        if length == max_n:
            break
        cand = cand[cand >= length]
        cand = cand[context[cand - length] == context[n_tok - 1 - length]]
        length += 1
    if best_end < 0:
        return _EMPTY
    start = best_end + 1
    return context[start : start + min(k, n_tok - start)]


def ngram_drafter(impl: str = "auto") -> tuple[NgramFn, str]:
    """The n-gram function to use and which implementation it is.

    ``impl``: ``"vllm"`` (vLLM's numba function; fails if vLLM is missing),
    ``"numpy"``, or ``"auto"`` (vLLM's when importable, else numpy).
    """
    if impl not in ("auto", "vllm", "numpy"):
        raise ValueError(f"unknown ngram implementation {impl!r}")
    if impl != "numpy":
        from agentspec.engine.vllm.surface import load

        try:
            vllm_fn = load("ngram_propose")
        except ImportError:
            if impl == "vllm":
                raise
        else:

            def fn(context: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
                return vllm_fn(context, min_n, max_n, _NO_MODEL_LEN_LIMIT, k)

            return fn, "vllm"
    return ngram_draft_numpy, "numpy"
