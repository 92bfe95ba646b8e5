"""Validated token-id arrays and a growable buffer of them.

The native suffix tree takes contiguous 1-D int32 arrays without copying; everything the
index stores or passes down goes through :func:`as_token_array` first, so bad input is
refused with a clear message before it can reach native code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentspec.errors import DraftIndexError

_INT32_MAX = np.iinfo(np.int32).max


def as_token_array(tokens: Sequence[int] | np.ndarray, what: str = "token ids") -> np.ndarray:
    """Return ``tokens`` as a contiguous 1-D int32 array, or raise :class:`DraftIndexError`.

    Accepts a sequence of Python ints or a 1-D integer numpy array; refuses floats, bools,
    strings, nested sequences, negative ids and ids that do not fit in int32.
    """
    if isinstance(tokens, np.ndarray) and tokens.dtype == np.int32 and tokens.ndim == 1:
        # The hot path (every decoding step): int32 needs only the sign check. A step
        # brings a few tokens, for which a Python min is ~5x cheaper than numpy's reduction.
        n = len(tokens)
        if n and (min(tokens.tolist()) if n <= 64 else tokens.min()) < 0:
            raise DraftIndexError(f"{what} must be non-negative, got {int(tokens.min())}")
        return np.ascontiguousarray(tokens)
    if type(tokens) is list and len(tokens) <= 64 and all(type(t) is int for t in tokens):
        # The other hot path: a decoding step's few tokens as Python ints (the driver's).
        low, high = (min(tokens), max(tokens)) if tokens else (0, 0)
        if low < 0:
            raise DraftIndexError(f"{what} must be non-negative, got {low}")
        if high > _INT32_MAX:
            raise DraftIndexError(f"{what} must fit in int32, got {high}")
        return np.array(tokens, dtype=np.int32)
    if isinstance(tokens, (str, bytes)):
        raise DraftIndexError(f"{what} must be a sequence of integers, got {type(tokens).__name__}")
    try:
        arr = np.asarray(tokens)
    except (ValueError, TypeError, OverflowError) as exc:
        raise DraftIndexError(f"{what} must be a flat sequence of integers: {exc}") from None
    if arr.ndim != 1:
        if arr.size == 0:
            return np.empty(0, dtype=np.int32)
        raise DraftIndexError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, dtype=np.int32)
    if arr.dtype.kind not in "iu":
        raise DraftIndexError(f"{what} must be integers, got {arr.dtype.name} values")
    low, high = int(arr.min()), int(arr.max())
    if low < 0:
        raise DraftIndexError(f"{what} must be non-negative, got {low}")
    if high > _INT32_MAX:
        raise DraftIndexError(f"{what} must fit in int32, got {high}")
    return np.ascontiguousarray(arr, dtype=np.int32)


def find_last(haystack: np.ndarray, needle: np.ndarray, start: int = 0) -> int:
    """Index of the last occurrence of ``needle`` in ``haystack[start:]`` (int32 arrays), or -1."""
    n = len(needle)
    if n == 0 or len(haystack) - start < n:
        return -1
    hay, pin = haystack[start:].tobytes(), needle.tobytes()
    at = hay.rfind(pin)
    while at >= 0 and at % 4:  # a match must start on a token boundary
        at = hay.rfind(pin, 0, at + len(pin) - 1)
    return -1 if at < 0 else start + at // 4


class TokenBuffer:
    """An append-only int32 sequence with amortised O(1) appends and zero-copy views."""

    __slots__ = ("_data", "_size")

    def __init__(self, initial: np.ndarray | None = None) -> None:
        size = 0 if initial is None else len(initial)
        self._data = np.empty(max(64, 2 * size), dtype=np.int32)
        if initial is not None and size:
            self._data[:size] = initial
        self._size = size

    def __len__(self) -> int:
        return self._size

    def append(self, tokens: np.ndarray) -> None:
        need = self._size + len(tokens)
        if need > len(self._data):
            grown = np.empty(max(need, 2 * len(self._data)), dtype=np.int32)
            grown[: self._size] = self._data[: self._size]
            self._data = grown
        self._data[self._size : need] = tokens
        self._size = need

    def view(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A contiguous view of ``[start:stop]``, valid until the next append; don't write to it.

        (Not flagged read-only: the native tree's bindings refuse read-only arrays.)
        """
        stop = self._size if stop is None else min(stop, self._size)
        return self._data[start:stop]

    def tail(self, n: int) -> np.ndarray:
        """The last ``n`` tokens (fewer if the buffer is shorter)."""
        return self.view(max(0, self._size - n))

    def common_prefix_len(self, other: np.ndarray) -> int:
        """Length of the longest common prefix of this buffer and ``other``."""
        n = min(self._size, len(other))
        if n == 0:
            return 0
        diff = np.flatnonzero(self._data[:n] != other[:n])
        return int(diff[0]) if len(diff) else n
