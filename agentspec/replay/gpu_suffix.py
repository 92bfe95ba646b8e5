"""vLLM 0.34's ``suffix`` method (the V2 runner's GPU suffix speculator), on the host.

vLLM 0.34 replaced arctic-inference's suffix tree with a speculator that drafts on the
device (``vllm/v1/worker/gpu/spec_decode/suffix/speculator.py``). This module computes
the same drafts with numpy, step for step, so the replay compares agentspec with what
a user of today's vLLM runs:

* **The request's own history.** The earlier occurrence of the longest suffix of
  prompt + output (up to ``suffix_decoding_max_tree_depth`` tokens) is continued; ties
  go to the latest occurrence.
* **A corpus of finished responses.** Each finished request's response, with the last
  3 prompt tokens ahead of it, is appended to a ring of ``suffix_decoding_corpus_tokens``
  tokens (a document that does not fit before the end wraps to offset 0). Every position
  is indexed under a hash of the 2 and of the 4 tokens before it; a bucket keeps 8 slots,
  slot ``document % 8`` holding the newest position of the newest such document. A
  step's candidates are the 16 slots of its two buckets, each checked and extended
  against the corpus to its true match length.
* **A vote.** For each candidate match length L, the candidates matching at least L
  tokens vote token by token (ties to the newest); the chain with the highest
  sum of per-token vote shares wins (ties: longer L). The corpus draft is used when its
  match is longer than the request's own.
* **Fixed length.** Every step verifies ``num_speculative_tokens`` slots (0.34's default:
  ``min(8, depth)``); slots past the real draft hold the last sampled token and are
  verified like any draft, so the replay proposes them too.

Adaptive verification (``enable_adaptive_verification``, off by default in 0.34) trims
slots by costs vLLM profiles on the GPU at start-up; the replay does not model it.
The index's 2^31-document reset is not modelled either (no replay reaches it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentspec.driver import TokenSeed
from agentspec.replay.baselines import NoProposer
from agentspec.replay.calls import CallSpec
from agentspec.replay.proposer import Proposer, ProposerSettings, ReplayDraft

#: The kernels' hash multiplier (an odd 64-bit constant), as a signed int64.
HASH_MUL = 0x9E3779B97F4A7C15 - (1 << 64)
#: Slots per hash bucket.
BUCKET_SLOTS = 8
#: Prompt tokens kept ahead of each response in the corpus.
PROMPT_CONTEXT = 3
_MASK64 = (1 << 64) - 1


def _signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def _bucket(hv: int, num_buckets: int) -> int:
    # Arithmetic shift of a signed value, as Triton's >> on int64 (Python's >> is one too).
    return ((hv >> 29) ^ hv) & (num_buckets - 1)


def _buckets(hv: np.ndarray, num_buckets: int) -> np.ndarray:
    """:func:`_bucket` of every value of an int64 array."""
    return ((hv >> 29) ^ hv) & (num_buckets - 1)


def key_hashes(tokens: Sequence[int] | np.ndarray) -> tuple[int, int]:
    """The (2-token, 4-token) hashes of the tokens before a position, newest first
    (``tokens`` ends just before it; missing tokens count as 0)."""
    hv = 0
    h2 = 0
    for d in range(4):
        tok = int(tokens[-1 - d]) if d < len(tokens) else 0
        hv = _signed64((hv ^ tok) * HASH_MUL)
        if d == 1:
            h2 = hv
    return h2, hv


def _doc_hashes(doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position j of ``doc``: the 2- and 4-token hashes of ``doc[j-2:j]``, ``doc[j-4:j]``."""
    n = doc.shape[0]
    hv = np.zeros(n, dtype=np.int64)
    h2 = hv
    padded = np.concatenate((np.zeros(4, dtype=np.int64), doc.astype(np.int64)))
    with np.errstate(over="ignore"):
        for d in range(4):
            prev = padded[3 - d : 3 - d + n]  # doc[j - 1 - d], 0 before the start
            hv = (hv ^ prev) * np.int64(HASH_MUL)
            if d == 1:
                h2 = hv.copy()
    return h2, hv


def local_match(context: np.ndarray, depth: int) -> tuple[int, int]:
    """(match length, end) of the latest earlier occurrence of ``context``'s longest
    suffix (at most ``depth`` tokens); the draft continues from ``end``. (0, 0): none."""
    n = context.shape[0]
    if n < 2 or depth < 1:
        return 0, 0
    # Candidate ends e in [1, n): context[e - 1] == context[n - 1].
    ends = np.flatnonzero(context[: n - 1] == context[n - 1]) + 1
    best = (0, 0)
    length = 0
    while ends.size:
        length += 1
        best = (length, int(ends[-1]))
        if length == depth or n - 1 - length < 0:
            break
        ends = ends[ends - 1 - length >= 0]
        ends = ends[context[ends - 1 - length] == context[n - 1 - length]]
    return best


class SuffixCorpus:
    """The ring of finished responses and its two hash tables, as 0.34's kernels keep them."""

    def __init__(self, capacity: int, depth: int, k: int) -> None:
        self.capacity = capacity
        self.depth = depth
        self.k = k
        # vLLM sizes the tables from the corpus: the next power of two >= capacity / 4.
        self.num_buckets = 1 << max(4, (max(16, capacity // 4) - 1).bit_length())
        self.tokens = np.full(max(capacity, 1), -1, dtype=np.int32)
        # [key kind: 0 = 4-token, 1 = 2-token, bucket, slot]: (document << 32) | position.
        self.table = np.full((2, self.num_buckets, BUCKET_SLOTS), -1, dtype=np.int64)
        self.head = 0
        self.documents = 0
        self.held = 0

    def add(self, doc: np.ndarray) -> None:
        """Append one finished document (prompt tail + response) and index it."""
        cap = self.capacity
        doc = doc[-(cap - 1) :] if doc.shape[0] > cap - 1 else doc
        n = doc.shape[0]
        head = 0 if self.head + n + 1 > cap else self.head
        end = head + n
        # Tokens overwritten (older documents, FIFO) no longer count as held.
        self.held -= int(np.count_nonzero(self.tokens[head : end + 1] >= 0))
        self.tokens[head:end] = doc
        self.tokens[end] = -1
        self.held += n
        seq = self.documents
        slot = seq % BUCKET_SLOTS
        vals = (np.int64(seq) << np.int64(32)) | (head + np.arange(n, dtype=np.int64))
        h2, h4 = _doc_hashes(doc)
        j = np.arange(n)
        for kind, hashes, key_len in ((0, h4, 4), (1, h2, 2)):
            has_key = j >= key_len
            # A view of the slot's column: at() writes through it; max keeps the newest entry.
            np.maximum.at(self.table[kind, :, slot], _buckets(hashes[has_key], self.num_buckets), vals[has_key])
        self.head = end + 1
        self.documents += 1

    def draft(self, context: np.ndarray) -> tuple[int, list[int]]:
        """(match length, draft) from the corpus for a request whose tokens are ``context``."""
        n = context.shape[0]
        if self.documents == 0 or n < 2:
            return 0, []
        h2, h4 = key_hashes(context[-4:])
        vals = np.concatenate(
            (self.table[0, _bucket(h4, self.num_buckets)], self.table[1, _bucket(h2, self.num_buckets)])
        )
        key_lens = (4,) * BUCKET_SLOTS + (2,) * BUCKET_SLOTS
        tail = context[::-1][: self.depth]
        cands: list[tuple[int, int, int]] = []  # (entry, position, match length), slot order
        seen: set[int] = set()
        for i, val in enumerate(vals.tolist()):
            if val < 0:
                continue
            pos = val & 0xFFFFFFFF
            if pos >= self.capacity or self.tokens[pos] < 0 or pos in seen:
                continue
            back = self.tokens[max(pos - len(tail), 0) : pos][::-1]
            m = min(back.shape[0], tail.shape[0])
            miss = np.flatnonzero(back[:m] != tail[:m])
            length = int(miss[0]) if miss.size else m
            if length < key_lens[i] or n < key_lens[i]:
                continue
            seen.add(pos)
            cands.append((val, pos, length))
        if not cands:
            return 0, []
        conts = []
        for _, pos, _ in cands:
            cont = self.tokens[pos : min(pos + self.k, self.capacity)]
            stop = np.flatnonzero(cont < 0)
            conts.append(cont[: stop[0]] if stop.size else cont)
        best: tuple[int, int, int, list[int]] = (-1, 1, 0, [])  # (votes, candidates, match length, chain)
        scored: set[int] = set()
        for _, _, length in cands:
            if length in scored:
                continue
            scored.add(length)
            alive = [c for c, (_, _, cl) in enumerate(cands) if cl >= length]
            den = len(alive)
            votes, chain = 0, []
            for d in range(self.k):
                counts: dict[int, list[int]] = {}
                for c in alive:
                    if d < conts[c].shape[0]:
                        counts.setdefault(int(conts[c][d]), []).append(c)
                if not counts:
                    break
                top = max(len(v) for v in counts.values())
                # The most frequent token; ties go to the newest candidate.
                tok = max(
                    (tok for tok, v in counts.items() if len(v) == top),
                    key=lambda t: max(cands[c][0] for c in counts[t]),
                )
                votes += top
                chain.append(tok)
                alive = counts[tok]
            if votes * best[1] > best[0] * den or (votes * best[1] == best[0] * den and best[2] < length):
                best = (votes, den, length, chain)
        return best[2], best[3]

    def memory_bytes(self) -> int:
        return int(self.tokens.nbytes + self.table.nbytes)


class VllmSuffixProposer(NoProposer):
    """vLLM 0.34's ``suffix`` method: one corpus per server, drafts of fixed length."""

    def __init__(self, depth: int = 24, tokens: int | None = None, corpus_tokens: int = 1 << 20) -> None:
        if depth < 1:
            raise ValueError(f"suffix depth must be >= 1, got {depth}")
        if not 0 <= corpus_tokens < 1 << 31:
            raise ValueError(f"suffix corpus tokens must be in [0, 2**31), got {corpus_tokens}")
        self.depth = depth
        self.k = min(8, depth) if tokens is None else tokens
        if self.k < 1:
            raise ValueError(f"suffix tokens must be >= 1, got {self.k}")
        # vLLM drafts from each request alone when the corpus is off or depth < 2.
        self.corpus = SuffixCorpus(corpus_tokens, depth, self.k) if corpus_tokens and depth >= 2 else None
        self._prompt_tails: dict[str, np.ndarray] = {}
        self._outputs: dict[str, list[np.ndarray]] = {}
        #: Steps by where their draft came from: the corpus, the request's own history, neither.
        self.sources = {"corpus": 0, "own": 0, "none": 0}

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        self._prompt_tails[call.call_id] = prompt[-PROMPT_CONTEXT:].copy()
        self._outputs[call.call_id] = []

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        self._outputs[call_id].append(tokens.copy())

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        own_len, end = local_match(context, self.depth)
        draft = context[end : end + self.k].tolist() if own_len else []
        if self.corpus is not None:
            corpus_len, corpus_draft = self.corpus.draft(context)
            if corpus_len > own_len:
                own_len, draft = corpus_len, corpus_draft
                self.sources["corpus"] += 1
            elif draft:
                self.sources["own"] += 1
            else:
                self.sources["none"] += 1
        else:
            self.sources["own" if draft else "none"] += 1
        # Every slot is verified: the rest repeat the last sampled token.
        return ReplayDraft(draft + [int(context[-1])] * (self.k - len(draft)))

    def end_call(self, call_id: str) -> None:
        tail = self._prompt_tails.pop(call_id, None)
        outputs = self._outputs.pop(call_id, None)
        if self.corpus is not None and tail is not None and outputs is not None:
            self.corpus.add(np.concatenate([tail, *outputs]).astype(np.int32))

    def counters(self) -> dict[str, int]:
        return {
            "steps_drafted_from_corpus": self.sources["corpus"],
            "steps_drafted_from_own_history": self.sources["own"],
            "steps_without_match": self.sources["none"],
        }

    def memory_bytes(self) -> int:
        return self.corpus.memory_bytes() if self.corpus is not None else 0

    def held_tokens(self) -> int:
        return self.corpus.held if self.corpus is not None else 0


def make_vllm_suffix(settings: ProposerSettings) -> Proposer:
    # As vLLM: max_cached_requests = 0 turns the corpus off as corpus_tokens = 0 does.
    corpus = settings.suffix_corpus_tokens if settings.suffix_cached_requests else 0
    return VllmSuffixProposer(settings.suffix_depth, settings.suffix_fixed_tokens, corpus)
