"""The EAGLE-3 head's training forward equals drafting as vLLM runs it, and its checkpoint
has the layout vLLM's ``Eagle3LlamaForCausalLM`` loads."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from agentspec.head.eagle3 import ARCHITECTURE, Eagle3Head, HeadShape, load_head, save_head  # noqa: E402

SHAPE = HeadShape(
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    aux_layers=(1, 2, 3),
    draft_vocab_size=40,
)


def _rope_tables(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, SHAPE.head_dim, 2).float() / SHAPE.head_dim))
    angles = torch.outer(torch.arange(length).float(), inv)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos()[None], emb.sin()[None]


def _head() -> Eagle3Head:
    torch.manual_seed(0)
    head = Eagle3Head(SHAPE)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    return head


def _layer_pass(head: Eagle3Head, hidden, embed, cos, sin, cache_k, cache_v):
    """One position (or a causal block) of the decoder layer as an inference engine runs
    it: keys and values appended to the cache, attention over the whole cache."""
    from agentspec.head.eagle3 import _rope

    s = SHAPE
    t = hidden.shape[1]
    x = torch.cat([head.input_layernorm(embed), head.hidden_norm(hidden)], dim=-1)
    q = _rope(head.q_proj(x).view(1, t, s.num_attention_heads, s.head_dim).transpose(1, 2), cos, sin)
    k = _rope(head.k_proj(x).view(1, t, s.num_key_value_heads, s.head_dim).transpose(1, 2), cos, sin)
    v = head.v_proj(x).view(1, t, s.num_key_value_heads, s.head_dim).transpose(1, 2)
    cache_k = torch.cat([cache_k, k], dim=2)
    cache_v = torch.cat([cache_v, v], dim=2)
    rep = s.num_attention_heads // s.num_key_value_heads
    keys, values = cache_k.repeat_interleave(rep, 1), cache_v.repeat_interleave(rep, 1)
    scores = q @ keys.transpose(-1, -2) / math.sqrt(s.head_dim)
    n = keys.shape[2]
    # Causal within the block: query i sees the cache before the block and the block up to i.
    mask = torch.ones(t, n, dtype=torch.bool).tril(diagonal=n - t)
    attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ values
    x2 = head.o_proj(attn.transpose(1, 2).reshape(1, t, -1)) + hidden
    m = head.post_attention_layernorm(x2)
    prenorm = head.down_proj(torch.nn.functional.silu(head.gate_proj(m)) * head.up_proj(m)) + x2
    return head.lm_head(head.norm(prenorm)), prenorm, cache_k, cache_v


@pytest.mark.parametrize("start", [1, 5, 9])
def test_unrolled_passes_equal_chained_drafting_with_a_kv_cache(start: int) -> None:
    head = _head()
    length, passes = 12, 3
    aux = torch.randn(1, length, 3 * SHAPE.hidden_size)
    embeds = torch.randn(1, length, SHAPE.hidden_size)
    cos, sin = _rope_tables(length)
    with torch.no_grad():
        unrolled = head.unrolled(aux, embeds, cos, sin, passes)
        # The first pass over positions 0..start-1 (the verified tokens), then one position
        # per later pass, each reading the previous pass's state before its norm.
        empty = torch.zeros(1, SHAPE.num_key_value_heads, 0, SHAPE.head_dim)
        logits, prenorm, ck, cv = _layer_pass(
            head, head.fc(aux[:, :start]), embeds[:, :start], cos[:, :start], sin[:, :start], empty, empty
        )
        chained = [logits[:, -1]]
        for k in range(1, passes):
            p = start - 1 + k
            if p >= length:
                break
            logits, prenorm, ck, cv = _layer_pass(
                head, prenorm[:, -1:], embeds[:, p : p + 1], cos[:, p : p + 1], sin[:, p : p + 1], ck, cv
            )
            chained.append(logits[:, -1])
    for k, expected in enumerate(chained):
        assert torch.allclose(unrolled[k][:, start - 1 + k], expected, atol=1e-4), k


def test_checkpoint_has_vllms_eagle3_layout_and_round_trips(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    head = _head()
    with torch.no_grad():
        head.d2t.copy_(torch.arange(SHAPE.draft_vocab_size) * 2 - torch.arange(SHAPE.draft_vocab_size))
    target_config = {"vocab_size": 100, "hidden_size": 32, "tie_word_embeddings": True, "model_type": "llama"}
    save_head(head, target_config, tmp_path, {"tenants": ["acme"]})
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE]
    assert config["draft_vocab_size"] == SHAPE.draft_vocab_size
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["tie_word_embeddings"] is False
    assert config["agentspec"]["tenants"] == ["acme"]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert tensors["fc.weight"].shape == (32, 96)
    assert tensors["layers.0.self_attn.q_proj.weight"].shape == (32, 64)  # reads [embedding, state]
    assert tensors["lm_head.weight"].shape == (SHAPE.draft_vocab_size, 32)
    assert "embed_tokens.weight" not in tensors  # the target's embeddings are shared
    assert int(tensors["t2d"].sum()) == SHAPE.draft_vocab_size
    assert tensors["t2d"][torch.arange(SHAPE.draft_vocab_size) * 2].all()
    again = load_head(tmp_path)
    for name, value in head.state_dict().items():
        assert torch.equal(again.state_dict()[name], value), name
