"""A trained EAGLE-3 head drafting beside its target, step by step, as vLLM's EAGLE-3
proposer drafts: for the replay benchmark (``agentspec bench --drafter``).

Each stream (a session) keeps two caches across steps and calls, as a server keeps its
KV caches and its prefix cache: the target's KV cache over the tokens it has read, and the
head's first-pass keys and values over the same positions. At a step whose context is
``c[0..L-1]`` (``c[L-1]`` just emitted), the target reads the tokens it has not read up to
``c[L-2]``, the head's first pass runs over those positions (each reading the target's
states there and the embedding of the token after it), and its state at ``L-2`` drafts the
first token; each further token is one more pass over the head's own previous state,
attending to the first pass's cache and the chain's own keys, which are then dropped. A new
call of the session reuses both caches up to the first token it does not share with what
was read before (the window of a condensed prompt moves; the rest is read again).

The drafts are the head's greedy choices over its draft vocabulary, mapped to target ids.
A context longer than the target's positions gets no draft.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from agentspec.head.eagle3 import Eagle3Head, _rope, load_head
from agentspec.head.files import DrafterLoadError, check_pair
from agentspec.head.target import TargetModel

__all__ = ["DrafterLoadError", "HeadDrafter"]


@dataclass
class _Stream:
    """What one session's drafting has read: token ids, and the caches over them."""

    #: Tokens the target has read (positions 0..n-1).
    read: list[int] = field(default_factory=list)
    #: The token after the last read one, which the head's last first-pass entry embedded.
    next_token: int | None = None
    target_cache: Any = None
    #: The head's first-pass keys and values, [1, kv heads, n, head dim].
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    #: The first pass's state before its norm at the last read position.
    last_prenorm: torch.Tensor | None = None
    last_logits: torch.Tensor | None = None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class HeadDrafter:
    """Greedy drafts of an EAGLE-3 head (:func:`~agentspec.head.eagle3.load_head`'s
    layout) over a target model, with per-stream caches (``max_streams`` kept, least
    recently used dropped first)."""

    def __init__(self, head: Eagle3Head, target: TargetModel, max_streams: int = 8) -> None:
        if max_streams < 1:
            raise ValueError("max_streams must be at least 1")
        self.head = head.to(target.device).eval()
        self.target = target
        self.max_streams = max_streams
        self.max_positions = int(getattr(target.config, "max_position_embeddings", 0) or 0) or None
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self._draft_ids = self.head.draft_ids
        self._base = target.model.get_decoder()

    @classmethod
    def load(cls, head_dir: Path, target_dir: Path, device: str = "cpu", max_streams: int = 8) -> HeadDrafter:
        """The head in ``head_dir`` (from ``agentspec train-drafter``) over the target in
        ``target_dir``; :class:`DrafterLoadError` when they do not go together."""
        check_pair(head_dir, target_dir)
        return cls(load_head(head_dir), TargetModel(target_dir, device), max_streams)

    # ------------------------------------------------------------------ drafting

    @torch.no_grad()
    def draft(self, stream: str, context: Sequence[int], tokens: int) -> list[int]:
        """Up to ``tokens`` draft tokens to follow ``context`` (the stream's prompt and
        output so far, its last token just emitted)."""
        length = len(context)
        if tokens <= 0 or length < 2 or (self.max_positions is not None and length + tokens > self.max_positions):
            return []
        state = self._stream(stream)
        self._read(state, context)
        assert state.last_prenorm is not None and state.last_logits is not None
        out = [self._to_target(state.last_logits)]
        prenorm = state.last_prenorm
        keys, values = state.keys, state.values
        for k in range(1, tokens):
            # Pass k+1 at position L-2+k reads the previous pass's state and the embedding
            # of the token it drafted; its key joins the chain's (not the stream's) cache.
            position = length - 2 + k
            embed = self.target.embed(torch.tensor([[out[-1]]], device=self.target.device))
            logits, prenorm, keys, values = self._layer(prenorm, embed, position, keys, values)
            out.append(self._to_target(logits[:, -1]))
        return out

    @torch.no_grad()
    def call_chains(self, stream: str, prompt: Sequence[int], output: Sequence[int], tokens: int) -> list[list[int]]:
        """The drafts of every decoding step of one call at once: row ``i`` drafts after
        ``prompt + output[:i + 1]``, for ``i`` up to the output's second last token (empty
        when the call does not fit the target's positions).

        Each row equals :meth:`draft`'s up to and including its first token that differs
        from ``output``; past it, a row holds the head's choices given the recorded tokens
        instead of its own. Greedy verification against ``output`` never reads past that
        token, so what a step accepts is the same, from one forward pass per call instead
        of one per step.
        """
        full = [*prompt, *output]
        n, p = len(full), len(prompt)
        if tokens <= 0 or p < 1 or len(output) < 2:
            return []
        if self.max_positions is not None and n + tokens > self.max_positions:
            return []
        state = self._stream(stream)
        # The first pass from the prompt's last position on is this call's own: read again.
        read = self._read(state, full, reread_from=p - 1)
        assert read is not None
        start, logits, prenorm = read
        lo = p - 1 - start  # row of position p - 1
        keys, values = state.keys, state.values
        assert keys is not None and values is not None
        # The recorded tokens each later pass embeds, padded past the output's end (nothing
        # is verified there).
        ahead = torch.tensor([[*full[p:], *([0] * tokens)]], device=self.target.device)
        drafts = [self._draft_ids[logits[0, lo:].argmax(-1)]]
        hidden = prenorm[:, lo:]
        rows = hidden.shape[1]
        own: list[tuple[torch.Tensor, torch.Tensor]] = []
        for j in range(1, tokens):
            # Row r is the chain started at position p - 1 + r; its pass j+1 sits at
            # p - 1 + r + j, embeds the recorded token after it, reads the row's last state.
            embeds = self.target.embed(ahead[:, j : j + rows])
            logits_j, hidden = self._chain_pass(hidden, embeds, p - 1 + j, keys, values, own)
            drafts.append(self._draft_ids[logits_j[0].argmax(-1)])
        table = torch.stack(drafts, dim=1)[: len(output) - 1]
        return [[int(t) for t in row] for row in table.tolist()]

    def forget(self, stream: str) -> None:
        """Drop a stream's caches (its session ended)."""
        self._streams.pop(stream, None)

    # ------------------------------------------------------------------ internals

    def _stream(self, key: str) -> _Stream:
        state = self._streams.pop(key, None) or _Stream()
        self._streams[key] = state  # most recently used last
        while len(self._streams) > self.max_streams:
            self._streams.popitem(last=False)
        return state

    def _to_target(self, logits: torch.Tensor) -> int:
        return int(self._draft_ids[int(logits.reshape(-1, logits.shape[-1])[-1].argmax())])

    def _read(
        self, state: _Stream, context: Sequence[int], reread_from: int | None = None
    ) -> tuple[int, torch.Tensor, torch.Tensor] | None:
        """Bring the stream to ``context``: the target reads ``context[:-1]``, the head's
        first pass covers the same positions (position q embeds ``context[q + 1]``).
        Positions from ``reread_from`` on are read again even if cached. Returns the first
        position read and the first pass's logits and states from there (None: nothing new)."""
        want = list(context[:-1])
        known = state.read + ([state.next_token] if state.next_token is not None else [])
        # Position q's head entry depends on tokens up to q + 1: keep entries whose q + 1
        # is shared, and the target's states up to there (they are read again from it).
        keep = min(len(state.read), max(0, _common_prefix(known, context) - 1))
        if keep == len(want) and (keep < len(state.read) or state.last_prenorm is None):
            keep -= 1  # the context ends inside what was read: its last position is read again
        if reread_from is not None:
            keep = min(keep, reread_from)
        if keep < len(state.read):
            self._crop(state, keep)
        new = want[keep:]
        if not new:
            return None  # the same context as the last step's
        ids = torch.tensor([new], device=self.target.device)
        out = self._base(
            input_ids=ids,
            past_key_values=state.target_cache,
            use_cache=True,
            output_hidden_states=True,
        )
        state.target_cache = out.past_key_values
        aux = torch.cat([out.hidden_states[i] for i in self.head.shape.aux_layers], dim=-1)
        next_ids = torch.tensor([list(context[keep + 1 : len(context)])], device=self.target.device)
        embeds = self.target.embed(next_ids)
        logits, prenorm, keys, values = self._layer(self.head.fc(aux), embeds, keep, state.keys, state.values)
        state.keys, state.values = keys, values
        state.last_prenorm = prenorm[:, -1:]
        state.last_logits = logits[:, -1]
        state.read = want
        state.next_token = int(context[-1])
        return keep, logits, prenorm

    def _crop(self, state: _Stream, keep: int) -> None:
        keys, values = state.keys, state.values
        if keep == 0 or state.target_cache is None or keys is None or values is None:
            self._streams_reset(state)
            return
        drop = len(state.read) - keep
        state.target_cache.crop(-drop)  # a negative count removes that many (transformers 4 and 5)
        state.keys = keys[:, :, :keep]
        state.values = values[:, :, :keep]
        state.read = state.read[:keep]
        state.next_token = None
        state.last_prenorm = state.last_logits = None

    @staticmethod
    def _streams_reset(state: _Stream) -> None:
        state.read, state.next_token, state.target_cache = [], None, None
        state.keys = state.values = state.last_prenorm = state.last_logits = None

    def _chain_pass(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        first_position: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        own: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One later pass of many chains at once, row ``r`` at position
        ``first_position + r``: it attends to the first pass's cache up to the position its
        chain started at, and to its own chain's later passes (``own``, extended here)."""
        head, s = self.head, self.head.shape
        t = hidden.shape[1]
        positions = torch.arange(first_position, first_position + t, device=hidden.device).unsqueeze(0)
        cos, sin = self._base.rotary_emb(hidden, positions)
        x = torch.cat([head.input_layernorm(embeds), head.hidden_norm(hidden)], dim=-1)
        q = _rope(head.q_proj(x).view(1, t, s.num_attention_heads, s.head_dim).transpose(1, 2), cos, sin)
        k = _rope(head.k_proj(x).view(1, t, s.num_key_value_heads, s.head_dim).transpose(1, 2), cos, sin)
        v = head.v_proj(x).view(1, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        rep = s.num_attention_heads // s.num_key_value_heads
        own.append((k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
        # The chain of row r started at first_position + r - len(own): the cache up to there.
        started = first_position - len(own)
        attn = _attend_chains(q, keys, values, rep, started, own)
        x = head.o_proj(attn.transpose(1, 2).reshape(1, t, -1)) + hidden
        m = head.post_attention_layernorm(x)
        prenorm = head.down_proj(F.silu(head.gate_proj(m)) * head.up_proj(m)) + x
        return head.lm_head(head.norm(prenorm)), prenorm

    def _layer(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        start: int,
        cache_k: torch.Tensor | None,
        cache_v: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The head's decoder layer over positions ``start..start+T-1`` (``hidden``: the
        fused target states for a first pass, or the previous pass's state), attending to
        the cache and causally within the block."""
        head, s = self.head, self.head.shape
        t = hidden.shape[1]
        positions = torch.arange(start, start + t, device=hidden.device).unsqueeze(0)
        cos, sin = self._base.rotary_emb(hidden, positions)
        x = torch.cat([head.input_layernorm(embeds), head.hidden_norm(hidden)], dim=-1)
        q = _rope(head.q_proj(x).view(1, t, s.num_attention_heads, s.head_dim).transpose(1, 2), cos, sin)
        k = _rope(head.k_proj(x).view(1, t, s.num_key_value_heads, s.head_dim).transpose(1, 2), cos, sin)
        v = head.v_proj(x).view(1, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
        keys = k if cache_k is None else torch.cat([cache_k, k], dim=2)
        values = v if cache_v is None else torch.cat([cache_v, v], dim=2)
        # Causal over the cache and the block: query i (position n - t + i) sees keys up to it.
        attn = _attend_chains(q, keys, values, s.num_attention_heads // s.num_key_value_heads, keys.shape[2] - t, [])
        x = head.o_proj(attn.transpose(1, 2).reshape(1, t, -1)) + hidden
        m = head.post_attention_layernorm(x)
        prenorm = head.down_proj(F.silu(head.gate_proj(m)) * head.up_proj(m)) + x
        return head.lm_head(head.norm(prenorm)), prenorm, keys, values


#: Queries per block of the head's attention: a long prompt's first pass is read in blocks,
#: so its scores never hold more than this many rows at once.
_QUERY_BLOCK = 512


def _attend_chains(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rep: int,
    started: int,
    own: list[tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """Row r's query attends to cached positions ``0..started + r`` and to the keys of its own
    row in each of ``own`` (one per later pass so far, this one's last)."""
    t = q.shape[2]
    keys = keys.repeat_interleave(rep, 1)
    values = values.repeat_interleave(rep, 1)
    n = keys.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = []
    for lo in range(0, t, _QUERY_BLOCK):
        hi = min(t, lo + _QUERY_BLOCK)
        qb = q[:, :, lo:hi]
        mask = torch.ones(hi - lo, n, dtype=torch.bool, device=q.device).tril(diagonal=started + lo)
        scores = (qb @ keys.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~mask, float("-inf"))
        diagonal = [(qb * k[:, :, lo:hi]).sum(-1, keepdim=True) * scale for k, _ in own]
        weights = torch.softmax(torch.cat([scores, *diagonal], dim=-1), dim=-1)
        block = weights[..., :n] @ values
        for i, (_, v) in enumerate(own):
            block = block + weights[..., n + i : n + i + 1] * v[:, :, lo:hi]
        out.append(block)
    return torch.cat(out, dim=2)
