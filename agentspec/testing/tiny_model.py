"""A tiny, deterministic Llama model for tests that need a real vLLM server.

The tokenizer is a byte-level BPE trained on the Python standard library's own source
files (always present, no download), with a ChatML chat template; the model is a 4-layer
Llama with random weights drawn from a fixed seed. Outputs are gibberish but fully
deterministic, which is all a speculative-decoding test needs: greedy outputs must be the
same with and without speculation, and repetition in them is real repetition.

Building takes ~10 s; the result is cached in a folder keyed by :data:`BUILD_VERSION`, so
a test session builds it at most once (``AGENTSPEC_TINY_MODEL_DIR`` chooses the cache
folder; otherwise the caller passes one).
"""

from __future__ import annotations

import json
import os
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Bump when anything below changes the built files, so stale caches are not reused.
BUILD_VERSION = 2

VOCAB_SIZE = 4096
SEED = 1234
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

#: ChatML, as Qwen-style models use it; the hermes tool parser reads ``<tool_call>`` blocks
#: from plain text, so tool-call tests work with this template too.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ENV_DIR = "AGENTSPEC_TINY_MODEL_DIR"


def _training_files(limit_bytes: int = 6_000_000) -> list[str]:
    """Standard-library ``.py`` files, in a stable order, up to about ``limit_bytes``."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            size = path.stat().st_size
        except OSError:
            continue
        files.append(str(path))
        total += size
        if total >= limit_bytes:
            break
    if not files:
        raise RuntimeError(f"no .py files found in the standard library at {stdlib}")
    return files


def _build_tokenizer(out: Path) -> None:
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(_training_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def _token_id(tokenizer: object, token: str) -> int:
    tid = tokenizer.convert_tokens_to_ids(token)  # type: ignore[attr-defined]
    if not isinstance(tid, int):
        raise TypeError(f"tokenizer has no single id for {token!r}")
    return tid


def _build_model(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=_token_id(tokenizer, "<|im_end|>"),
        pad_token_id=_token_id(tokenizer, "<|endoftext|>"),
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)  # float32, torch's default dtype
    # Random init with std 0.02 gives near-uniform logits. Scaling the output layer keeps
    # the greedy choice but widens the gap between the top two logits far beyond float32
    # noise, so greedy outputs cannot flip between batch shapes (with and without
    # speculation) for numerical reasons alone.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(str(out), safe_serialization=True)
    model.generation_config.save_pretrained(str(out))


def build_tiny_model(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Build (or reuse) the tiny model and return its folder.

    ``cache_dir`` defaults to ``$AGENTSPEC_TINY_MODEL_DIR``; one of them must be given.
    The folder is written atomically (build in a sibling, then rename), so concurrent
    test sessions never see a half-built model.
    """
    root = Path(cache_dir or os.environ.get(ENV_DIR) or "")
    if not str(root):
        raise ValueError(f"pass cache_dir or set {ENV_DIR}")
    target = root / f"agentspec-tiny-llama-v{BUILD_VERSION}"
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{target.name}.{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    _build_tokenizer(staging)
    _build_model(staging)
    (staging / "agentspec-tiny.json").write_text(json.dumps({"build_version": BUILD_VERSION}))
    try:
        staging.rename(target)
    except OSError:
        # Another process won the race; its copy is identical (deterministic build).
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return target


def build_tiny_drafter(target: str | os.PathLike[str], layers: int = 2) -> Path:
    """Build (or reuse) a draft model for the tiny model: its first ``layers`` layers with
    their weights, the same embeddings, head and tokenizer, in a sibling folder.

    It agrees with the target less often than the target itself would, as a real small
    drafter does, and shares its vocabulary, as vLLM's ``draft_model`` method requires.
    """
    import shutil

    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    target = Path(target)
    out = target.parent / f"{target.name}-drafter-{layers}l"
    if (out / "config.json").exists():
        return out
    staging = target.parent / f".{out.name}.{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    model = LlamaForCausalLM.from_pretrained(str(target), torch_dtype=torch.float32)
    if not 0 < layers <= model.config.num_hidden_layers:
        raise ValueError(f"layers must be in 1..{model.config.num_hidden_layers}, got {layers}")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(str(staging), safe_serialization=True)
    model.generation_config.save_pretrained(str(staging))
    AutoTokenizer.from_pretrained(str(target)).save_pretrained(str(staging))
    try:
        staging.rename(out)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process built the same files
    return out


def build_tiny_eagle_head(target: str | os.PathLike[str]) -> Path:
    """Build (or reuse) an EAGLE head for the tiny model, for vLLM's ``eagle`` method: one
    decoder layer after ``fc`` (the token's embedding joined with the target's hidden
    state), random weights from a fixed seed; it shares the target's embeddings and head,
    as EAGLE heads do. Its drafts are rarely right: it is for the wiring, not for speed.
    """
    from transformers import LlamaConfig

    target = Path(target)
    out = target.parent / f"{target.name}-eagle"
    if (out / "config.json").exists():
        return out
    config = LlamaConfig.from_pretrained(str(target))
    config.num_hidden_layers = 1
    config.architectures = ["EagleLlamaForCausalLM"]
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    weight = _seeded_weights(SEED + 1)
    tensors = {
        "fc.weight": weight(h, 2 * h),
        "layers.0.self_attn.q_proj.weight": weight(h, h),
        "layers.0.self_attn.k_proj.weight": weight(kv, h),
        "layers.0.self_attn.v_proj.weight": weight(kv, h),
        "layers.0.self_attn.o_proj.weight": weight(h, h),
        "layers.0.mlp.gate_proj.weight": weight(i, h),
        "layers.0.mlp.up_proj.weight": weight(i, h),
        "layers.0.mlp.down_proj.weight": weight(h, i),
        "layers.0.post_attention_layernorm.weight": _ones(h),
    }
    return _save_head(config, tensors, target, out)


def build_tiny_eagle3_head(target: str | os.PathLike[str]) -> Path:
    """Build (or reuse) an EAGLE-3 head for the tiny model, for vLLM's ``eagle3`` method
    (``Eagle3LlamaForCausalLM``): ``fc`` joins three of the target's hidden states (after
    layers 1, 2 and 3), then one decoder layer whose attention reads the token's
    embedding beside that; random weights from a fixed seed, the target's embeddings and
    head, its full vocabulary (no ``d2t`` map). For the wiring, not for speed.
    """
    from transformers import LlamaConfig

    target = Path(target)
    out = target.parent / f"{target.name}-eagle3"
    if (out / "config.json").exists():
        return out
    config = LlamaConfig.from_pretrained(str(target))
    aux_layers = [1, 2, 3]
    config.num_hidden_layers = 1
    config.architectures = ["LlamaForCausalLMEagle3"]
    config.eagle_aux_hidden_state_layer_ids = aux_layers
    config.draft_vocab_size = config.vocab_size
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    weight = _seeded_weights(SEED + 2)
    tensors = {
        "fc.weight": weight(h, len(aux_layers) * h),
        # The layer's attention reads [embedding, hidden state]: twice the width.
        "layers.0.self_attn.q_proj.weight": weight(h, 2 * h),
        "layers.0.self_attn.k_proj.weight": weight(kv, 2 * h),
        "layers.0.self_attn.v_proj.weight": weight(kv, 2 * h),
        "layers.0.self_attn.o_proj.weight": weight(h, h),
        "layers.0.mlp.gate_proj.weight": weight(i, h),
        "layers.0.mlp.up_proj.weight": weight(i, h),
        "layers.0.mlp.down_proj.weight": weight(h, i),
        **{
            f"layers.0.{norm}.weight": _ones(h)
            for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm")
        },
        "norm.weight": _ones(h),
    }
    return _save_head(config, tensors, target, out)


#: The reduced head's draft vocabulary: every other id below twice its size.
REDUCED_DRAFT_VOCAB = 1024


def build_tiny_reduced_eagle3_head(target: str | os.PathLike[str]) -> Path:
    """Build (or reuse) an EAGLE-3 head for the tiny model in the layout ``agentspec
    train-drafter`` writes (:func:`agentspec.head.eagle3.save_head`): a reduced draft
    vocabulary mapped to the target's ids by ``d2t`` (every other id, so the map is no
    identity), its own output layer started from the target's rows for those ids, random
    weights from a fixed seed otherwise. For sampling through a reduced vocabulary, not for
    speed.
    """
    import shutil

    import torch
    from safetensors.torch import load_file

    from agentspec.head.eagle3 import Eagle3Head, HeadShape, save_head

    target = Path(target)
    out = target.parent / f"{target.name}-eagle3-reduced"
    if (out / "config.json").exists():
        return out
    config = json.loads((target / "config.json").read_text())
    h = config["hidden_size"]
    shape = HeadShape(
        hidden_size=h,
        intermediate_size=config["intermediate_size"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config.get("head_dim") or h // config["num_attention_heads"],
        rms_norm_eps=config["rms_norm_eps"],
        aux_layers=(1, 2, 3),
        draft_vocab_size=REDUCED_DRAFT_VOCAB,
    )
    torch.manual_seed(SEED + 3)
    head = Eagle3Head(shape)
    ids = torch.arange(REDUCED_DRAFT_VOCAB) * 2
    with torch.no_grad():
        head.d2t.copy_(ids - torch.arange(REDUCED_DRAFT_VOCAB))
        head.lm_head.weight.copy_(load_file(str(target / "model.safetensors"))["lm_head.weight"][ids])
    staging = target.parent / f".{out.name}.{os.getpid()}"
    save_head(head, config, staging, {"built_for": "tests"})
    try:
        staging.rename(out)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process built the same files
    return out


def _seeded_weights(seed: int) -> Callable[..., Any]:
    """A function returning small random weight tensors (``weight(*shape)``), the same
    sequence for the same seed."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return lambda *shape: torch.randn(*shape, generator=generator) * 0.02


def _ones(size: int) -> Any:
    """A norm's weight: ones."""
    import torch

    return torch.ones(size)


def _save_head(config: Any, tensors: dict[str, Any], target: Path, out: Path) -> Path:
    """Write a head's config and weights to ``out`` atomically (built in a sibling)."""
    import shutil

    from safetensors.torch import save_file

    staging = target.parent / f".{out.name}.{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(staging))
    save_file(tensors, str(staging / "model.safetensors"))
    try:
        staging.rename(out)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # another process built the same files
    return out


if __name__ == "__main__":  # pragma: no cover - manual use
    import sys

    print(build_tiny_model(sys.argv[1] if len(sys.argv) > 1 else None))
