"""Token helpers (agentspec.index.tokens)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from agentspec.index.tokens import find_last


def _naive_find_last(hay: list[int], pin: list[int], start: int) -> int:
    for i in range(len(hay) - len(pin), start - 1, -1):
        if hay[i : i + len(pin)] == pin:
            return i
    return -1


@given(
    hay=st.lists(st.integers(0, 3), max_size=60),
    pin=st.lists(st.integers(0, 3), min_size=1, max_size=5),
    start=st.integers(0, 60),
)
def test_find_last_agrees_with_a_plain_search(hay: list[int], pin: list[int], start: int) -> None:
    start = min(start, len(hay))
    got = find_last(np.asarray(hay, np.int32), np.asarray(pin, np.int32), start)
    assert got == _naive_find_last(hay, pin, start)


def test_find_last_ignores_byte_matches_off_token_boundaries() -> None:
    # 256 = bytes 00 01 00 00, 1 = 01 00 00 00: [256, 1] holds the bytes of [1] at offset 1.
    hay = np.asarray([256, 1 << 24], np.int32)
    assert find_last(hay, np.asarray([1], np.int32)) == -1
