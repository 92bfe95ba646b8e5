"""An EAGLE-3 head in plain torch, laid out as vLLM 0.32 loads it (``Eagle3LlamaForCausalLM``).

The head drafts from the target's own hidden states: ``fc`` joins the states after three
of the target's layers (vLLM's ``eagle_aux_hidden_state_layer_ids``), then one Llama
decoder layer whose attention reads the next token's embedding (the target's embeddings,
shared and frozen) beside that, then a norm and an output layer over a reduced draft
vocabulary (``d2t`` maps each draft id to its target id, as EAGLE-3 checkpoints do).

Drafting runs the head again on its own output: the second draft token reads the first
pass's state before its final norm, not the target's. :meth:`Eagle3Head.unrolled` trains
that as it runs ("training-time test"): pass ``k`` at position ``q`` reads pass ``k-1``'s
state at ``q-1`` and attends to the first pass's keys up to ``q-k`` and to each later
pass's key on its own diagonal, which is exactly what vLLM's draft KV cache holds when it
drafts the ``k``-th token.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Eagle3Head", "HeadShape", "load_head", "save_head"]

#: The architecture name vLLM maps to its EAGLE-3 Llama head.
ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class HeadShape:
    """The head's sizes: the target's, with its chosen layers and draft vocabulary."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    aux_layers: tuple[int, ...]
    draft_vocab_size: int


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + self.eps) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # cos/sin: [B, T, D] from the target's own rotary embedding (any rope type it uses).
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


def _shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """``x`` moved ``by`` positions later along the sequence axis (-2 for [B, H, T, D], 1 for
    [B, T, ...] is given by the caller); the first ``by`` rows are zeros."""
    if by == 0:
        return x
    pad = torch.zeros_like(x[..., :by, :])
    return torch.cat([pad, x[..., :-by, :]], dim=-2)


class Eagle3Head(nn.Module):
    """One EAGLE-3 decoder layer over the target's hidden states (module names match the
    checkpoint's keys, see :func:`save_head`)."""

    def __init__(self, shape: HeadShape) -> None:
        super().__init__()
        self.shape = shape
        h, i = shape.hidden_size, shape.intermediate_size
        q_size = shape.num_attention_heads * shape.head_dim
        kv_size = shape.num_key_value_heads * shape.head_dim
        self.fc = nn.Linear(len(shape.aux_layers) * h, h, bias=False)
        self.input_layernorm = _RMSNorm(h, shape.rms_norm_eps)
        self.hidden_norm = _RMSNorm(h, shape.rms_norm_eps)
        # The attention reads [embedding, hidden state]: twice the width.
        self.q_proj = nn.Linear(2 * h, q_size, bias=False)
        self.k_proj = nn.Linear(2 * h, kv_size, bias=False)
        self.v_proj = nn.Linear(2 * h, kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, h, bias=False)
        self.post_attention_layernorm = _RMSNorm(h, shape.rms_norm_eps)
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.norm = _RMSNorm(h, shape.rms_norm_eps)
        self.lm_head = nn.Linear(h, shape.draft_vocab_size, bias=False)
        # Draft id -> target id, as an offset (EAGLE-3's ``d2t``: target = draft + d2t).
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab_size, dtype=torch.long))

    @property
    def draft_ids(self) -> torch.Tensor:
        """The target ids of the draft vocabulary, in draft-id order."""
        return torch.arange(self.shape.draft_vocab_size, device=self.d2t.device) + self.d2t

    def unrolled(
        self,
        aux_states: torch.Tensor,
        next_embeds: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        passes: int,
    ) -> list[torch.Tensor]:
        """Draft logits of ``passes`` chained passes at every position (see the module doc).

        ``aux_states``: [B, T, layers x hidden], the target's states at each position;
        ``next_embeds``: [B, T, hidden], the embedding of the token after each position;
        ``cos``/``sin``: the target's rotary tables at positions 0..T-1. Pass ``k``'s logits
        at ``q`` draft the token at ``q + 2``; rows ``q < k`` have no real input.
        """
        s = self.shape
        b, t, _ = next_embeds.shape
        hidden = self.fc(aux_states)
        embeds = self.input_layernorm(next_embeds)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        logits: list[torch.Tensor] = []
        causal = torch.ones(t, t, dtype=torch.bool, device=hidden.device)
        for _ in range(passes):
            residual = hidden
            x = torch.cat([embeds, self.hidden_norm(hidden)], dim=-1)
            q = self.q_proj(x).view(b, t, s.num_attention_heads, s.head_dim).transpose(1, 2)
            key = self.k_proj(x).view(b, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
            value = self.v_proj(x).view(b, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
            q, key = _rope(q, cos, sin), _rope(key, cos, sin)
            keys.append(key)
            values.append(value)
            attn = self._attend(q, keys, values, causal)
            x = self.o_proj(attn.transpose(1, 2).reshape(b, t, -1)) + residual
            mlp_in = self.post_attention_layernorm(x)
            prenorm = self.down_proj(F.silu(self.gate_proj(mlp_in)) * self.up_proj(mlp_in)) + x
            logits.append(self.lm_head(self.norm(prenorm)))
            # The next pass at q reads this pass's state at q - 1.
            hidden = _shift(prenorm, 1)
        return logits

    def _attend(
        self, q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], causal: torch.Tensor
    ) -> torch.Tensor:
        """Pass ``k = len(keys) - 1``: the first pass's keys at positions <= q - k, and pass
        ``j``'s key at q - k + j for j = 1..k (one per later pass, on its diagonal)."""
        s = self.shape
        k = len(keys) - 1
        rep = s.num_attention_heads // s.num_key_value_heads
        scale = 1.0 / math.sqrt(s.head_dim)
        first_k = keys[0].repeat_interleave(rep, dim=1)
        first_v = values[0].repeat_interleave(rep, dim=1)
        scores = (q @ first_k.transpose(-1, -2)) * scale
        allowed = torch.tril(causal, diagonal=-k)
        scores = scores.masked_fill(~allowed, float("-inf"))
        diagonal_scores: list[torch.Tensor] = []
        diagonal_values: list[torch.Tensor] = []
        for j in range(1, k + 1):
            key_j = _shift(keys[j].repeat_interleave(rep, dim=1), k - j)
            diagonal_scores.append((q * key_j).sum(-1, keepdim=True) * scale)
            diagonal_values.append(_shift(values[j].repeat_interleave(rep, dim=1), k - j))
        # Pass k's own key (j = k) is always there, so no row is all -inf.
        weights = torch.softmax(torch.cat([scores, *diagonal_scores], dim=-1), dim=-1)
        t = q.shape[-2]
        out = weights[..., :t] @ first_v
        for j, value in enumerate(diagonal_values):
            out = out + weights[..., t + j : t + j + 1] * value
        return out


def _checkpoint_keys(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """The head's weights under the names vLLM's ``Eagle3LlamaForCausalLM`` loads."""
    layer = {
        "self_attn.q_proj": head.q_proj,
        "self_attn.k_proj": head.k_proj,
        "self_attn.v_proj": head.v_proj,
        "self_attn.o_proj": head.o_proj,
        "mlp.gate_proj": head.gate_proj,
        "mlp.up_proj": head.up_proj,
        "mlp.down_proj": head.down_proj,
        "input_layernorm": head.input_layernorm,
        "hidden_norm": head.hidden_norm,
        "post_attention_layernorm": head.post_attention_layernorm,
    }
    tensors = {f"layers.0.{name}.weight": module.weight for name, module in layer.items()}
    tensors["fc.weight"] = head.fc.weight
    tensors["norm.weight"] = head.norm.weight
    tensors["lm_head.weight"] = head.lm_head.weight
    return {name: tensor.detach().contiguous().float() for name, tensor in tensors.items()}


def save_head(head: Eagle3Head, target_config: dict[str, Any], out: Path, metadata: dict[str, Any]) -> None:
    """Write ``head`` to ``out`` as an EAGLE-3 checkpoint vLLM loads (``config.json`` and
    ``model.safetensors``); ``metadata`` is kept in the config under ``agentspec``."""
    from safetensors.torch import save_file

    s = head.shape
    config = dict(target_config)
    for key in ("auto_map", "quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(key, None)
    config.update(
        architectures=[ARCHITECTURE],
        num_hidden_layers=1,
        eagle_aux_hidden_state_layer_ids=list(s.aux_layers),
        draft_vocab_size=s.draft_vocab_size,
        # The head has its own (reduced) output layer; the embeddings are the target's.
        tie_word_embeddings=False,
        agentspec={"shape": asdict(s), **metadata},
    )
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.cpu() for name, tensor in _checkpoint_keys(head).items()}
    tensors["d2t"] = head.d2t.detach().cpu().clone()
    t2d = torch.zeros(int(target_config["vocab_size"]), dtype=torch.bool)
    t2d[head.draft_ids.cpu()] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_head(folder: Path) -> Eagle3Head:
    """A head written by :func:`save_head`."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    raw = config["agentspec"]["shape"]
    shape = HeadShape(**{**raw, "aux_layers": tuple(raw["aux_layers"])})
    head = Eagle3Head(shape)
    tensors = load_file(str(folder / "model.safetensors"))
    names = {name: tensor for name, tensor in _checkpoint_keys(head).items()}
    with torch.no_grad():
        for name in names:
            _parameter(head, name).copy_(tensors[name])
        head.d2t.copy_(tensors["d2t"])
    return head


def _parameter(head: Eagle3Head, checkpoint_name: str) -> torch.Tensor:
    """The parameter behind a checkpoint key (``layers.0.mlp.up_proj.weight`` -> ``up_proj``)."""
    parts = checkpoint_name.removesuffix(".weight").split(".")
    module: nn.Module = getattr(head, parts[-1])
    return module.weight  # type: ignore[return-value]
