"""Time a Llama-shaped decoding step on a CUDA GPU, to calibrate agentspec's speed model.

    python benchmarks/gpu_step_time.py --models 8b,32b --out step_times.json
    python benchmarks/speed_calibration.py step_times.json      # predicted vs measured

``agentspec.draft_budget.speed_model`` estimates a vLLM decoding step from a roofline of the GPU. This
script measures what the roofline stands for: one forward pass of a decoder with the
named model's shape (random bf16 weights) over ``batch`` requests that each verify
``verified`` tokens (the last token plus a draft) against ``context`` tokens of KV cache,
then the logits of every verified token and their argmax, as vLLM's verification needs.
Each step is captured once in a CUDA graph and replayed, as vLLM replays its decode
graphs, so Python's launch cost is not in the time.

What the step holds, per layer: RMSNorm, the fused QKV projection, attention over the
cache (FlashAttention with the KV split into chunks and the chunks merged by their
log-sum-exp, as decode kernels do, so one request's attention still fills the GPU), the
output projection, RMSNorm, the gated MLP. Left out, each small beside the matrix
products: rotary embeddings, writing the new tokens' keys and values into the cache, and
vLLM's scheduling and sampling on the CPU (its fixed step cost, which this script cannot
see; the speed model keeps that as a separate term).

Needs only PyTorch with CUDA (no vLLM, no agentspec), so it can be copied to any GPU
host. It prints one line per step and writes every measurement as JSON, along with the
GPU's measured copy bandwidth and dense bf16 matrix rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import platform
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    """The dimensions of a Llama-style decoder (agentspec.draft_budget.speed_model.MODELS names the same)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


SHAPES: dict[str, Shape] = {
    "8b": Shape(hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256),
    "32b": Shape(hidden=5120, intermediate=27648, layers=64, heads=40, kv_heads=8, head_dim=128, vocab=152064),
    "70b": Shape(hidden=8192, intermediate=28672, layers=80, heads=64, kv_heads=8, head_dim=128, vocab=128256),
    # For a dry run on the CPU (--device cpu): the same code path at a size that runs anywhere.
    "tiny": Shape(hidden=256, intermediate=512, layers=2, heads=8, kv_heads=2, head_dim=32, vocab=1024),
}

BF16 = torch.bfloat16


class Decoder:
    """Random weights of ``shape`` and a KV pool of ``kv_tokens`` tokens, on ``device``."""

    def __init__(self, shape: Shape, kv_tokens: int, device: torch.device) -> None:
        self.shape = shape
        s = shape
        q_width = (s.heads + 2 * s.kv_heads) * s.head_dim

        def weight(rows: int, cols: int) -> torch.Tensor:
            # Random, not zeros: a GPU's matrix units run measurably faster on zeros.
            return torch.randn(rows, cols, device=device, dtype=BF16) * 0.02

        self.layers = [
            {
                "qkv": weight(s.hidden, q_width),
                "o": weight(s.heads * s.head_dim, s.hidden),
                "gate_up": weight(s.hidden, 2 * s.intermediate),
                "down": weight(s.intermediate, s.hidden),
                "norm1": torch.ones(s.hidden, device=device, dtype=BF16),
                "norm2": torch.ones(s.hidden, device=device, dtype=BF16),
            }
            for _ in range(s.layers)
        ]
        self.final_norm = torch.ones(s.hidden, device=device, dtype=BF16)
        self.lm_head = weight(s.hidden, s.vocab)
        per_layer = 2 * kv_tokens * s.kv_heads * s.head_dim
        self.kv = torch.randn(s.layers, per_layer, device=device, dtype=BF16)
        self.kv_tokens = kv_tokens

    def weight_bytes(self) -> int:
        tensors = [t for layer in self.layers for t in layer.values()] + [self.final_norm, self.lm_head]
        return sum(t.numel() * t.element_size() for t in tensors)

    def step(self, x: torch.Tensor, batch: int, verified: int, context: int, splits: int) -> torch.Tensor:
        """One verification step: ``x`` is ``[batch * verified, hidden]``; returns the
        argmax token of every position."""
        s = self.shape
        group = s.heads // s.kv_heads
        chunk = context // splits
        cache = batch * context * s.kv_heads * s.head_dim
        for layer, kv in zip(self.layers, self.kv, strict=True):
            h = _rms_norm(x, layer["norm1"])
            qkv = h @ layer["qkv"]
            q = qkv[:, : s.heads * s.head_dim]
            # The cache's layout: request, chunk, KV head, position, dim, so that one view
            # gives every (request, chunk) pair its own attention problem.
            k = kv[:cache].view(batch * splits, s.kv_heads, chunk, s.head_dim)
            v = kv[cache : 2 * cache].view(batch * splits, s.kv_heads, chunk, s.head_dim)
            # The query heads that share a KV head stack along the query axis (GQA as MQA).
            q = q.view(batch, verified, s.kv_heads, group, s.head_dim).permute(0, 2, 3, 1, 4)
            q = q.reshape(batch, 1, s.kv_heads, group * verified, s.head_dim)
            q = q.expand(batch, splits, -1, -1, -1).reshape(batch * splits, s.kv_heads, group * verified, s.head_dim)
            out = _split_attention(q, k, v, batch, splits)
            out = out.view(batch, s.kv_heads, group, verified, s.head_dim).permute(0, 3, 1, 2, 4)
            x = x + out.reshape(batch * verified, s.heads * s.head_dim) @ layer["o"]
            h = _rms_norm(x, layer["norm2"])
            gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        logits = _rms_norm(x, self.final_norm) @ self.lm_head
        return logits.argmax(dim=-1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` over all of ``k``/``v`` (no mask) and each query's log-sum-exp."""
    if q.is_cuda:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[:2]
    return out, lse[..., : q.shape[-2]]


def _split_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, splits: int) -> torch.Tensor:
    """Attention over KV cut into ``splits`` chunks per request, merged by log-sum-exp."""
    out, lse = _flash(q, k, v)
    if splits == 1:
        return out
    out = out.view(batch, splits, *out.shape[1:]).float()
    weights = torch.softmax(lse.view(batch, splits, *lse.shape[1:]).float(), dim=1)
    return (out * weights.unsqueeze(-1)).sum(dim=1).to(q.dtype)


def split_count(batch: int, kv_heads: int, context: int, sms: int) -> int:
    """Chunks per request so that the attention problems cover the GPU twice over, each
    chunk at least 256 positions (a power of two that divides ``context``)."""
    splits = 1
    while batch * kv_heads * splits < 2 * sms and context % (splits * 2) == 0 and context // (splits * 2) >= 256:
        splits *= 2
    return splits


def check_split_attention(device: torch.device) -> float:
    """Largest difference between the split attention and PyTorch's plain attention."""
    torch.manual_seed(0)
    batch, kv_heads, group, verified, context, dim, splits = 2, 2, 4, 3, 1024, 64, 4
    q = torch.randn(batch, kv_heads, group * verified, dim, device=device, dtype=BF16)
    k = torch.randn(batch, kv_heads, context, dim, device=device, dtype=BF16)
    v = torch.randn(batch, kv_heads, context, dim, device=device, dtype=BF16)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    chunks = context // splits

    def split(t: torch.Tensor) -> torch.Tensor:
        return (
            t.view(batch, kv_heads, splits, chunks, dim).transpose(1, 2).reshape(batch * splits, kv_heads, chunks, dim)
        )

    qs = q.unsqueeze(1).expand(batch, splits, -1, -1, -1).reshape(batch * splits, kv_heads, group * verified, dim)
    got = _split_attention(qs, split(k), split(v), batch, splits)
    return float((got.float() - expected).abs().max())


def _time(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after two warm-ups."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def _graphed(fn, device: torch.device):
    """``fn`` captured in a CUDA graph (replayed as vLLM replays its decode graphs); on the
    CPU, ``fn`` itself."""
    if device.type != "cuda":
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def probe_gpu(device: torch.device) -> dict[str, float]:
    """The copy bandwidth (bytes read and written per second) and the bf16 matrix rate."""
    n = 1 << 30
    a = torch.empty(n, device=device, dtype=torch.uint8)
    b = torch.empty_like(a)
    copy_s = _time(lambda: b.copy_(a), device, 10)
    m = 8192
    x = torch.randn(m, m, device=device, dtype=BF16)
    y = torch.randn(m, m, device=device, dtype=BF16)
    mm_s = _time(lambda: x @ y, device, 10)
    return {"copy_bytes_per_s": 2 * n / copy_s, "matmul_flops_per_s": 2 * m**3 / mm_s}


def _write(path: str, record: dict[str, object]) -> None:
    shapes = {name: dataclasses.asdict(shape) for name, shape in record["shapes"].items()}  # type: ignore[attr-defined]
    with open(path, "w") as f:
        json.dump(record | {"shapes": shapes}, f, indent=1)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="8b", help="Comma-separated shapes: " + ", ".join(SHAPES))
    ap.add_argument("--batch", default="1,8,32,64,128", help="Requests per step (comma-separated).")
    ap.add_argument("--verified", default="1,2,4,8,16", help="Tokens each request verifies (1 + draft).")
    ap.add_argument("--context", default="2048,8192", help="Tokens of KV cache per request.")
    ap.add_argument("--kv-gib", type=float, default=None, help="KV pool size (default: what the GPU has left).")
    ap.add_argument(
        "--layers",
        type=int,
        default=None,
        help="Time the shapes with this many layers (a model too big for the GPU, cut down);"
        " the rows then name the shape NAME-Nl and the JSON records its dimensions.",
    )
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="Write the measurements here as JSON.")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this script times a GPU (use --device cpu --models tiny for a dry run)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    error = check_split_attention(device)
    print(f"split attention vs plain attention: max difference {error:.4f}", flush=True)
    if error > 0.05:
        print("split attention disagrees with plain attention: refusing to time it", file=sys.stderr)
        return 1
    record: dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "probe": probe_gpu(device) if device.type == "cuda" else {},
        "rows": [],
    }
    print(f"device {record['device']}, probe {record['probe']}", flush=True)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
    rows: list[dict[str, object]] = record["rows"]  # type: ignore[assignment]
    shapes: dict[str, Shape] = {}
    record["shapes"] = shapes

    for base in args.models.split(","):
        shape = SHAPES[base]
        name = base
        if args.layers is not None:
            shape = dataclasses.replace(shape, layers=args.layers)
            name = f"{base}-{args.layers}l"
        shapes[name] = shape
        kv_per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
        if device.type == "cuda":
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info(device)
            weights = 2 * (
                shape.layers
                * (
                    shape.hidden * (shape.heads + 2 * shape.kv_heads) * shape.head_dim
                    + shape.heads * shape.head_dim * shape.hidden
                    + 3 * shape.hidden * shape.intermediate
                )
                + shape.hidden * shape.vocab
            )
            spare = free - weights - (12 << 30)  # activations, logits, graphs
            kv_bytes = spare if args.kv_gib is None else min(spare, int(args.kv_gib * (1 << 30)))
        else:
            kv_bytes = int((args.kv_gib or 0.05) * (1 << 30))
        kv_tokens = int(kv_bytes // kv_per_token)
        if kv_tokens <= 0:
            print(f"{name}: the weights leave no room for a KV cache here; skipped", flush=True)
            continue
        t0 = time.perf_counter()
        decoder = Decoder(shape, kv_tokens, device)
        print(
            f"{name}: {decoder.weight_bytes() / 1e9:.1f} GB of weights, KV pool {kv_tokens} tokens"
            f" ({kv_tokens * kv_per_token / 1e9:.1f} GB), built in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        for context in _ints(args.context):
            for batch in _ints(args.batch):
                if batch * context > kv_tokens:
                    print(f"{name} context {context} batch {batch}: KV cache does not fit; skipped", flush=True)
                    continue
                for verified in _ints(args.verified):
                    splits = split_count(batch, shape.kv_heads, context, sms)
                    x = torch.randn(batch * verified, shape.hidden, device=device, dtype=BF16)

                    step = functools.partial(decoder.step, x, batch, verified, context, splits)
                    try:
                        seconds = _time(_graphed(step, device), device, args.repeats)
                    except torch.OutOfMemoryError:
                        print(f"{name} context {context} batch {batch} verified {verified}: out of memory", flush=True)
                        torch.cuda.empty_cache()
                        continue
                    finally:
                        del step, x  # the step holds the decoder: drop it before the next model
                    row = {
                        "model": name,
                        "batch": batch,
                        "verified": verified,
                        "context": context,
                        "splits": splits,
                        "seconds": seconds,
                    }
                    rows.append(row)
                    tokens = batch * verified
                    print(
                        f"{name} context {context:>5} batch {batch:>3} verified {verified:>2}: "
                        f"{seconds * 1e3:8.3f} ms ({tokens / seconds:,.0f} verified tokens/s)",
                        flush=True,
                    )
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    if args.out:  # written as it goes: a run cut short keeps what it measured
                        _write(args.out, record)
        del decoder
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.out:
        _write(args.out, record)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
