"""One suffix tree and the sequences in it, oldest first.

A thin owner of arctic-inference's native ``SuffixTree``: it hands out sequence ids,
counts the tokens each sequence holds (the memory budget is kept in tokens) and can
drop the oldest sequences that nobody is still writing to.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
from arctic_inference.suffix_decoding._C import SuffixTree

from agentspec.index.policy import DraftPolicy


@dataclass(frozen=True, slots=True)
class TreeDraft:
    """What one tree proposes for a context."""

    token_ids: list[int]
    probs: list[float]
    score: float
    match_len: int


EMPTY_TREE_DRAFT = TreeDraft([], [], 0.0, 0)


class Corpus:
    """A suffix tree over a set of token sequences, with per-sequence token counts."""

    __slots__ = ("_tree", "_lengths", "_next_seq", "tokens", "_measured")

    #: Relative change in tokens after which :meth:`memory_bytes` measures the tree again.
    REMEASURE_AFTER = 0.1

    def __init__(self, max_depth: int) -> None:
        self._tree = SuffixTree(max_depth)
        # Insertion-ordered: the first key is the oldest sequence.
        self._lengths: dict[int, int] = {}
        self._next_seq = 0
        self.tokens = 0
        self._measured: tuple[int, int] | None = None  # (tokens, bytes) at the last measurement

    def __len__(self) -> int:
        return len(self._lengths)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._lengths

    def new_sequence(self) -> int:
        seq_id = self._next_seq
        # Native ids are int32; wrapping is safe because live ids are far fewer.
        self._next_seq = (self._next_seq + 1) & 0x7FFFFFFF
        while self._next_seq in self._lengths:
            self._next_seq = (self._next_seq + 1) & 0x7FFFFFFF
        self._lengths[seq_id] = 0
        return seq_id

    def extend(self, seq_id: int, tokens: np.ndarray) -> int:
        """Append validated int32 ``tokens`` to a sequence; returns how many were added."""
        n = len(tokens)
        if n and seq_id in self._lengths:
            self._tree.extend_ndarray(seq_id, tokens)
            self._lengths[seq_id] += n
            self.tokens += n
            return n
        return 0

    def remove(self, seq_id: int) -> int:
        """Drop a sequence; returns the tokens freed (0 if it was not held)."""
        n = self._lengths.pop(seq_id, None)
        if n is None:
            return 0
        self._tree.remove(seq_id)
        self.tokens -= n
        return n

    def drop_oldest(self, keep: Collection[int] = ()) -> int:
        """Drop the oldest sequence not in ``keep``; returns the tokens freed (0: none left)."""
        for seq_id in self._lengths:
            if seq_id not in keep:
                return self.remove(seq_id)
        return 0

    def speculate(self, context: np.ndarray, max_tokens: int, policy: DraftPolicy) -> TreeDraft:
        """Draft the continuation of ``context`` (its last ``max_depth`` tokens are used)."""
        if not self.tokens or max_tokens <= 0 or not len(context):
            return EMPTY_TREE_DRAFT
        d = self._tree.speculate_ndarray(
            context,
            max_tokens,
            policy.max_spec_factor,
            policy.max_spec_offset,
            policy.min_token_prob,
            False,
        )
        if not d.token_ids:
            return EMPTY_TREE_DRAFT
        # ``probs`` are path probabilities (each the estimated chance that the draft is
        # right up to that token), and ``min_token_prob`` already cut the draft on them.
        return TreeDraft(list(d.token_ids), list(d.probs), float(d.score), int(d.match_len))

    def speculate_tree(self, context: np.ndarray, max_nodes: int, policy: DraftPolicy):
        """Tree speculation (every branch after the match); returns the native draft."""
        return self._tree.speculate_ndarray(
            context, max_nodes, policy.max_spec_factor, policy.max_spec_offset, policy.min_token_prob, True
        )

    def memory_bytes(self, exact: bool = False) -> int:
        """The native tree's estimate of its memory use.

        Measuring walks the whole tree (about 40 ns per token held), too slow to repeat while
        a server is busy. Unless ``exact``, the tree is measured again only once its token
        count has changed by more than :attr:`REMEASURE_AFTER` since the last measurement, and
        scaled by the token count in between.
        """
        last = self._measured
        if exact or last is None or abs(self.tokens - last[0]) > self.REMEASURE_AFTER * max(last[0], 1):
            last = self._measured = (self.tokens, int(self._tree.estimate_memory()))
        tokens, measured = last
        return measured if tokens == self.tokens or not tokens else measured * self.tokens // tokens
