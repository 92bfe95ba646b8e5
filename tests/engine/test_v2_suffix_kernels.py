"""The replay's model of vLLM 0.34's suffix method drafts what vLLM's own kernels draft.

vLLM's real ``SuffixSpeculator`` (its Triton kernels, run by Triton's interpreter where
triton-cpu is absent: scripts/test_vllm034.sh) and ``agentspec.replay.gpu_suffix`` are fed
the same requests token by token; every step's drafts (all ``num_speculative_tokens``
slots, filler included) must be equal. The speculator gets the parts of vLLM's config and
request state it reads, as plain objects: building a whole engine adds nothing here, and
the live servers of the 0.34 suite run the same class.

Runs where vLLM 0.34 is installed (the 0.34 suite); skipped elsewhere.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

suffix = pytest.importorskip("vllm.v1.worker.gpu.spec_decode.suffix.speculator")
torch = pytest.importorskip("torch")

from agentspec.replay.calls import CallSpec  # noqa: E402
from agentspec.replay.gpu_suffix import VllmSuffixProposer  # noqa: E402

MAX_LEN = 96
SLOTS = 4


class _VllmSuffix:
    """vLLM's SuffixSpeculator over CPU tensors laid out as the V2 runner's RequestState."""

    def __init__(self, depth: int, k: int, corpus_tokens: int) -> None:
        spec = SimpleNamespace(
            num_speculative_tokens=k,
            suffix_decoding_max_tree_depth=depth,
            suffix_decoding_corpus_tokens=corpus_tokens,
            suffix_decoding_max_cached_requests=10000,
            enable_adaptive_verification=False,
        )
        config = SimpleNamespace(
            speculative_config=spec,
            scheduler_config=SimpleNamespace(max_num_seqs=SLOTS),
            model_config=SimpleNamespace(max_model_len=MAX_LEN),
        )
        self.states = SimpleNamespace(
            all_token_ids=SimpleNamespace(gpu=torch.zeros((SLOTS, MAX_LEN), dtype=torch.int32)),
            total_len=SimpleNamespace(gpu=torch.zeros(SLOTS, dtype=torch.int32)),
            prompt_len=SimpleNamespace(np=np.zeros(SLOTS, dtype=np.int32)),
            req_id_to_index={},
        )
        self.speculator = suffix.SuffixSpeculator(config, torch.device("cpu"), self.states)
        self.last = torch.zeros((SLOTS, 1), dtype=torch.int64)

    def set_tokens(self, req_id: str, slot: int, prompt_len: int, tokens: list[int]) -> None:
        s = self.states
        s.req_id_to_index[req_id] = slot
        s.prompt_len.np[slot] = prompt_len
        s.all_token_ids.gpu[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        s.total_len.gpu[slot] = len(tokens)
        self.last[slot, 0] = tokens[-1]

    def propose(self, slot: int) -> list[int]:
        batch = SimpleNamespace(num_reqs=1, idx_mapping=torch.tensor([slot], dtype=torch.int32))
        one, zero = torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
        drafts = self.speculator.propose(batch, None, None, None, None, one, zero, self.last, None, None, None)
        return drafts[0].tolist()

    def finish(self, req_ids: list[str]) -> None:
        self.speculator.on_requests_finished(req_ids)
        for req_id in req_ids:
            del self.states.req_id_to_index[req_id]


def _spec(cid: str) -> CallSpec:
    return CallSpec(call_id=cid, session_id=cid, group_id=cid, trajectory_id=cid, turn=0, source="t")


@pytest.mark.parametrize(
    ("seed", "depth", "k", "corpus_tokens", "vocab"),
    [(0, 24, 8, 1 << 12, 4), (1, 5, 3, 1 << 12, 3), (2, 24, 8, 128, 5), (3, 12, 6, 0, 4)],
    ids=["defaults", "short-depth", "ring-wraps", "no-corpus"],
)
def test_drafts_equal_vllms_kernels(seed: int, depth: int, k: int, corpus_tokens: int, vocab: int) -> None:
    rng = np.random.default_rng(seed)
    theirs = _VllmSuffix(depth, k, corpus_tokens)
    ours = VllmSuffixProposer(depth=depth, tokens=k, corpus_tokens=corpus_tokens)
    # A shared phrase makes the corpus matter: several responses repeat it.
    phrase = rng.integers(0, vocab, 12).tolist()
    steps = corpus_steps = written = 0
    for r in range(8):
        cid, slot = f"req-{r}", r % SLOTS
        prompt = rng.integers(0, vocab, int(rng.integers(4, 20))).tolist()
        output = rng.integers(0, vocab, int(rng.integers(6, 24))).tolist()
        if r % 2:
            output[2 : 2 + len(phrase)] = phrase
        output = output[: MAX_LEN - len(prompt)]
        ours.begin_call(_spec(cid), np.array(prompt, dtype=np.int32))
        for t in range(len(output)):
            tokens = prompt + output[: t + 1]
            ours.observe(cid, np.array(output[t : t + 1], dtype=np.int32))
            theirs.set_tokens(cid, slot, len(prompt), tokens)
            before = ours.sources["corpus"]
            mine = list(ours.propose(cid, np.array(tokens, dtype=np.int32)).token_ids)
            assert mine == theirs.propose(slot), f"request {r}, step {t}, tokens {tokens}"
            steps += 1
            corpus_steps += ours.sources["corpus"] - before
        ours.end_call(cid)
        theirs.finish([cid])
        written += min(3, len(prompt)) + len(output) + 1  # the document and its separator
    assert steps > 50
    # The cases exercise what they are named for.
    assert (corpus_steps > 0) == (corpus_tokens > 0)
    if corpus_tokens == 128:
        assert written > corpus_tokens  # the ring wrapped, overwriting the oldest documents
