"""Built-in proposers: none, vLLM's ngram method, vLLM 0.32's suffix tree, and the tree oracle.

(vLLM 0.34's ``suffix`` method, the ``vllm-suffix`` proposer, is :mod:`agentspec.replay.gpu_suffix`.)
These baselines reproduce what vLLM 0.32 does, call for call:

* ``vllm-ngram``: ``NgramProposer`` drafts from prompt + output so far (no state
  across requests; 0.34's ``ngram`` drafts alike).
* ``vllm-suffix-0.32``: ``SuffixDecodingProposer`` keeps one ``SuffixDecodingCache
  per server. On a request's first decoding step it calls ``start_request`` with
  the prompt (building a suffix tree over the whole prompt), then every step
  ``add_active_response`` with the newly sampled tokens and ``speculate`` with the
  last ``max_tree_depth`` tokens; ``stop_request`` when the request leaves the
  batch. Responses stay in the cache's global tree (FIFO, 10000 requests).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentspec.driver import TokenSeed
from agentspec.replay.calls import CallSpec
from agentspec.replay.ngram import ngram_drafter
from agentspec.replay.proposer import (
    EMPTY_DRAFT,
    Proposer,
    ProposerSettings,
    ReplayDraft,
)


class NoProposer:
    """No speculation: one token per step."""

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        pass

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        pass

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        return EMPTY_DRAFT

    def verified(self, call_id: str, drafted: int, accepted: int) -> None:
        pass

    def end_call(self, call_id: str) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0

    def held_tokens(self) -> int:
        return 0


class VllmNgramProposer(NoProposer):
    """vLLM's ``ngram`` method: prompt lookup over the request's own tokens."""

    def __init__(self, k: int, min_n: int, max_n: int, impl: str = "auto") -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {min_n}, {max_n}")
        self.k, self.min_n, self.max_n = k, min_n, max_n
        self._fn, self.impl = ngram_drafter(impl)
        # Compile now (vLLM does the same at start-up) so no step pays numba's JIT.
        self._fn(np.zeros(max_n + 2, dtype=np.int32), min_n, max_n, k)

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        draft = self._fn(context, self.min_n, self.max_n, self.k)
        return ReplayDraft(draft.tolist()) if draft.size else EMPTY_DRAFT


class VllmSuffixTreeProposer(NoProposer):
    """vLLM 0.32's ``suffix`` method (arctic-inference's tree), driven as
    ``SuffixDecodingProposer`` drives it."""

    def __init__(
        self,
        max_tree_depth: int = 24,
        num_speculative_tokens: int = 24,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = 10000,
    ) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.depth = max_tree_depth
        self.tokens = num_speculative_tokens
        self.factor = max_spec_factor
        self.min_prob = min_token_prob
        self.cache = SuffixDecodingCache(max_tree_depth=max_tree_depth, max_cached_requests=max_cached_requests)
        # Token counts for held_tokens(): a request's prompt while it runs (its own tree),
        # its response while the cache keeps it (the global tree).
        self._prompts: dict[str, int] = {}
        self._responses: dict[str, int] = {}

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        # vLLM request ids are unique per request; a reused id is reset as vLLM does.
        if call.call_id in self.cache.cached_requests:
            self.cache.evict_cached_response(call.call_id)
        self.cache.start_request(call.call_id, prompt)
        self._prompts[call.call_id] = len(prompt)
        self._responses[call.call_id] = 0

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        self.cache.add_active_response(call_id, tokens)
        self._responses[call_id] += len(tokens)

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        d = self.cache.speculate(
            call_id,
            context[-self.depth :],
            max_spec_tokens=self.tokens,
            max_spec_factor=self.factor,
            min_token_prob=self.min_prob,
        )
        return ReplayDraft(d.token_ids) if d.token_ids else EMPTY_DRAFT

    def end_call(self, call_id: str) -> None:
        self.cache.stop_request(call_id)
        self._prompts.pop(call_id, None)

    def held_tokens(self) -> int:
        cached = self.cache.cached_requests
        for call_id in [c for c in self._responses if c not in cached]:
            del self._responses[call_id]  # evicted by the cache (FIFO)
        return sum(self._prompts.values()) + sum(self._responses.values())

    def memory_bytes(self) -> int:
        # arctic exposes no public size; its trees do estimate their own memory.
        trees = [getattr(self.cache, "_global_tree", None)]
        trees += list(getattr(self.cache, "_local_trees", {}).values())
        return sum(t.estimate_memory() for t in trees if t is not None)


class _Stream:
    """A growable int32 token buffer (amortised O(1) appends)."""

    __slots__ = ("buf", "n", "seq")

    def __init__(self, seq: int, tokens: np.ndarray) -> None:
        self.seq = seq
        self.buf = np.array(tokens, dtype=np.int32)
        self.n = tokens.shape[0]

    def append(self, tokens: np.ndarray) -> None:
        need = self.n + tokens.shape[0]
        if need > self.buf.shape[0]:
            grown = np.empty(max(need, 2 * self.buf.shape[0]), dtype=np.int32)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : need] = tokens
        self.n = need

    def is_prefix_of(self, prompt: np.ndarray) -> bool:
        return self.n <= prompt.shape[0] and np.array_equal(self.buf[: self.n], prompt[: self.n])


class TreeOracle(NoProposer):
    """The ceiling: perfect choice among every branch the index offers.

    One global suffix tree holds everything this server has seen: each session's
    stream of prompts and outputs (a prompt that extends the session's previous
    prompt + output appends only its new tail; one that does not, e.g. after a
    condenser dropped turns, starts a new sequence), and so every session's and
    group's text. Each step it asks for a wide speculation tree (``use_tree_spec``,
    no probability floor, no match-length limit) and the verifier accepts the
    longest root path equal to the true continuation: the content is what a
    session-aware index can hold, the choice is made in hindsight.
    """

    def __init__(self, max_depth: int = 64, max_nodes: int = 256) -> None:
        from arctic_inference.suffix_decoding._C import SuffixTree

        self.depth = max_depth
        self.nodes = max_nodes
        self.tree = SuffixTree(max_depth)
        self._next_seq = 0
        self._sessions: dict[str, _Stream] = {}
        self._calls: dict[str, _Stream] = {}

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        stream = self._sessions.get(call.session_id)
        if stream is not None and stream.is_prefix_of(prompt):
            tail = prompt[stream.n :]
            if tail.size:
                self.tree.extend_ndarray(stream.seq, np.ascontiguousarray(tail))
                stream.append(tail)
        else:
            stream = _Stream(self._next_seq, prompt)
            self._next_seq += 1
            if prompt.size:
                self.tree.extend_ndarray(stream.seq, prompt)
            self._sessions[call.session_id] = stream
        self._calls[call.call_id] = stream

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        stream = self._calls[call_id]
        self.tree.extend_ndarray(stream.seq, tokens)
        stream.append(tokens)

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        d = self.tree.speculate_ndarray(context[-self.depth :], self.nodes, float(self.nodes), 0.0, 0.0, True)
        return ReplayDraft(d.token_ids, d.parents) if d.token_ids else EMPTY_DRAFT

    def end_call(self, call_id: str) -> None:
        del self._calls[call_id]

    def memory_bytes(self) -> int:
        return int(self.tree.estimate_memory())


def make_none(settings: ProposerSettings) -> Proposer:
    return NoProposer()


def make_vllm_ngram(settings: ProposerSettings) -> Proposer:
    return VllmNgramProposer(settings.ngram_k, settings.ngram_min, settings.ngram_max, settings.ngram_impl)


def make_vllm_suffix_tree(settings: ProposerSettings) -> Proposer:
    return VllmSuffixTreeProposer(
        settings.suffix_depth,
        settings.suffix_tokens,
        settings.suffix_factor,
        settings.suffix_min_prob,
        settings.suffix_cached_requests,
    )


def make_oracle(settings: ProposerSettings) -> Proposer:
    return TreeOracle(settings.oracle_depth, settings.oracle_nodes)
