"""What one pass of a candidate drafter costs beside one decoding step of its target, here.

    python benchmarks/drafter_cost.py [--model DIR] [--context 1024] [--layers 1,2,4] \
        [--draft-vocab 8192,16384,32768] [--json OUT]

The hybrid runs its drafter's first pass on every step it drafts (docs/engine.md), so a
drafter pays only where the tokens it adds outweigh that pass. This measures the passes
before anything is trained: the target (SmolLM2-135M-Instruct as agentspec.testing.real_model
builds it, unless ``--model``) and each candidate in float32 with transformers, one sequence
decoding one token with a KV cache of ``--context`` tokens, the median of ``--steps`` timed
passes after a warm-up:

- ``target``: one decoding step of the whole model;
- ``output layer``: the target's head alone (hidden x vocabulary: 576 x 49,152 here);
- ``draft model, k layers``: the target's first k layers, its norm and head (what vLLM's
  ``draft_model`` method runs with a truncated target);
- ``one layer + head over V``: an EAGLE-3-shaped drafter, one decoder layer and a head over a
  draft vocabulary of V tokens (EAGLE-3's draft-to-target map), its weights random (cost only).

Each row prints its time and its ratio to the target's step. Times are this machine's CPU
(absolute figures are noisy; the ratios are what carries over, roughly, to a CPU like it);
on a GPU the step is bound by memory and docs/speed.md's roofline is the estimate.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentspec.testing import real_model


def _decode_timer(model: Any, context: int, vocab: int, steps: int) -> float:
    """Median seconds of one decoding pass of ``model`` over a ``context``-token cache."""
    import torch

    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=generator)
    with torch.inference_mode():
        out = model(input_ids=prompt, use_cache=True)
        cache, token = out.past_key_values, prompt[:, -1:]
        times = []
        for i in range(steps + 3):  # three passes to warm up
            start = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            if i >= 3:
                times.append(time.perf_counter() - start)
            cache = out.past_key_values
    return statistics.median(times)


def _head_timer(head: Any, hidden: int, steps: int) -> float:
    import torch

    x = torch.randn(1, 1, hidden)
    with torch.inference_mode():
        for _ in range(3):
            head(x)
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            head(x)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _truncated(target: Any, layers: int) -> Any:
    """The target's first ``layers`` layers with its embeddings, norm and head (shared weights)."""
    draft = copy.copy(target)
    draft.model = copy.copy(target.model)
    draft.model.layers = target.model.layers[:layers]
    draft.config = copy.deepcopy(target.config)
    draft.config.num_hidden_layers = layers
    draft.model.config = draft.config
    return draft


def _eagle_shaped(target_config: Any, draft_vocab: int) -> Any:
    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target_config)
    config.num_hidden_layers = 1
    config.vocab_size = draft_vocab
    config.tie_word_embeddings = False
    return LlamaForCausalLM(config).eval()


def measure(model_dir: Path, context: int, layers: list[int], vocabs: list[int], steps: int) -> list[dict[str, Any]]:
    import torch
    from transformers import LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    config = target.config
    rows: list[tuple[str, Callable[[], float]]] = [
        ("target", lambda: _decode_timer(target, context, config.vocab_size, steps)),
        ("output layer", lambda: _head_timer(target.lm_head, config.hidden_size, steps)),
        *(
            (
                f"draft model, {k} layers",
                lambda k=k: _decode_timer(_truncated(target, k), context, config.vocab_size, steps),
            )
            for k in layers
        ),
        *(
            (f"one layer + head over {v:,}", lambda v=v: _decode_timer(_eagle_shaped(config, v), context, v, steps))
            for v in vocabs
        ),
    ]
    out = []
    for name, timer in rows:
        out.append({"pass": name, "seconds": timer()})
    step = out[0]["seconds"]
    for row in out:
        row["vs_target_step"] = row["seconds"] / step
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="target model folder (default: build the real model into --cache-dir)")
    p.add_argument("--cache-dir", default=os.environ.get(real_model.ENV_DIR), help="where the real model is built")
    p.add_argument("--context", type=int, default=1024, help="tokens in the KV cache of each timed pass")
    p.add_argument("--layers", default="1,2,4", help="draft models: the target's first k layers, comma-separated")
    p.add_argument("--draft-vocab", default="8192,16384,32768", help="EAGLE-3-shaped heads' vocabularies")
    p.add_argument("--steps", type=int, default=30, help="timed passes per row (the median is kept)")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    try:
        layers = [int(k) for k in args.layers.split(",") if k.strip()]
        vocabs = [int(v) for v in args.draft_vocab.split(",") if v.strip()]
    except ValueError as exc:
        p.error(f"--layers and --draft-vocab take comma-separated integers: {exc}")
    if args.model is None and not args.cache_dir:
        p.error(f"pass --model or --cache-dir (or set {real_model.ENV_DIR})")
    if args.model is not None and not (args.model / "config.json").exists():
        p.error(f"--model: no config.json in {args.model}")
    model_dir = args.model or real_model.build_real_model(args.cache_dir)

    rows = measure(model_dir, args.context, layers, vocabs, args.steps)
    table = Table(title=f"one pass, batch 1, {args.context} tokens of context, {os.cpu_count()} CPU cores")
    for col in ("pass", "ms", "vs the target's step"):
        table.add_column(col, justify="left" if col == "pass" else "right")
    for row in rows:
        table.add_row(row["pass"], f"{row['seconds'] * 1000:.2f}", f"{row['vs_target_step']:.3f}")
    Console(width=120).print(table)
    if args.json:
        settings = {"context": args.context, "steps": args.steps, "cpus": os.cpu_count(), "model": model_dir.name}
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
