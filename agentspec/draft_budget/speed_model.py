"""A model of a vLLM engine's decoding step, to estimate tokens/s at batch sizes.

A decoding step runs the target model once over every token the batch verifies: for each
request, its last emitted token plus its draft. Its time is the sum of three parts, each
bound by one resource of the GPU: reading the weights once, reading each request's KV
cache once, and the compute of the verified tokens (two FLOPs per weight per token, plus
attention over the context). Each layer adds a fixed cost (its small kernels and the gaps
between kernels), the step may add one more (scheduling on the CPU, where it is not hidden),
and the drafter's time is on the critical path::

    t_step   = step_overhead + layers * layer_overhead
               + weight_bytes / (bandwidth * memory_efficiency)
               + batch * context * kv_bytes_per_token / (bandwidth * kv_efficiency)
               + flops / (peak_flops * compute_efficiency) + batch * drafter
    flops    = batch * verified * (2 * params + 4 * layers * heads * head_dim * context)
    tokens/s = batch * emitted / t_step

A sum rather than the textbook roofline's maximum: a step's kernels each wait on memory or
on compute, one after another, so the two do not hide each other. The efficiencies and the
per-layer cost are fitted to decoding steps timed on an H200
(``benchmarks/results/``, ``benchmarks/speed_calibration.py``, docs/speed.md): Llama-shaped
8B, 32B and 70B-wide forward passes in PyTorch, replayed from CUDA graphs, which this model
matches within 5% RMS, also on a shape left out of the fit.

``verified`` and ``emitted`` are per request and step. With a draft capped at ``k``
tokens they come from the drafts a replay measured (:class:`DraftOutcomes`): a draft cut
to its first ``k`` tokens keeps ``min(accepted, k)`` of them, because acceptance is a
prefix. The batch is what fits: requests whose KV cache does not fit in the GPU's memory
wait, as they do in vLLM, so at long contexts more concurrency adds no batch.

Assumptions (see docs/speed.md): bf16 weights and KV cache; tensor parallelism divides
weights, KV and FLOPs evenly and costs nothing more; prefill is left out (it is the same
with and without speculation); vLLM's scheduling on the CPU is taken as hidden behind the
GPU's work (``step_overhead_s`` 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

__all__ = ["GPUS", "MODELS", "DraftOutcomes", "GpuSpec", "ModelShape", "SpeedModel", "parse_speed_model"]


class GpuSpec(BaseModel):
    """A GPU's roofline: memory bandwidth, dense bf16 compute and memory size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    memory_bandwidth: PositiveFloat = Field(description="Bytes per second.")
    peak_flops: PositiveFloat = Field(description="Dense bf16 FLOP per second.")
    memory_bytes: PositiveFloat


class ModelShape(BaseModel):
    """A decoder-only transformer's shape, as far as the roofline needs it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    params: PositiveFloat
    layers: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    bytes_per_value: PositiveInt = 2  # bf16

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_value

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values of one token over every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_value

    def flops_per_token(self, context: float) -> float:
        """One verified token: the weights' multiply-adds and attention over ``context``."""
        return 2 * self.params + 4 * self.layers * self.heads * self.head_dim * context


#: The GPUs the issue tracker's targets name (vendor figures, dense bf16).
GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(name="H100 SXM", memory_bandwidth=3.35e12, peak_flops=989e12, memory_bytes=80e9),
    "h200": GpuSpec(name="H200", memory_bandwidth=4.8e12, peak_flops=989e12, memory_bytes=141e9),
}
#: Llama-3-shaped models (the 32B takes Qwen2.5-32B's shape: Llama 3 has no 32B).
MODELS: dict[str, ModelShape] = {
    "8b": ModelShape(name="Llama-3-8B shape", params=8.03e9, layers=32, heads=32, kv_heads=8, head_dim=128),
    "32b": ModelShape(name="32B (Qwen2.5-32B shape)", params=32.8e9, layers=64, heads=40, kv_heads=8, head_dim=128),
    "70b": ModelShape(name="Llama-3-70B shape", params=70.6e9, layers=80, heads=64, kv_heads=8, head_dim=128),
}


class SpeedModel(BaseModel):
    """Step time and tokens/s of one engine (``tensor_parallel`` GPUs) on a model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: GpuSpec
    model: ModelShape
    #: GPUs the model is split over; None: the fewest (a power of two) whose memory holds
    #: the weights in ``weights_share`` of it.
    tensor_parallel: PositiveInt | None = None
    #: Share of the GPUs' memory the weights may take (the rest: KV cache, activations).
    weights_share: float = Field(0.6, gt=0, lt=1)
    #: Share of the memory left after the weights that holds the KV cache (vLLM's
    #: ``gpu_memory_utilization`` 0.9 less activations).
    kv_share: float = Field(0.85, gt=0, le=1)
    # Fitted on an H200 (module docstring; benchmarks/speed_fit.py refits them).
    #: Share of the memory bandwidth reached reading the weights (with the per-layer cost
    #: beside it: the two together are the weights' time).
    memory_efficiency: float = Field(1.0, gt=0, le=1)
    #: Share of the memory bandwidth reached reading the KV cache (attention).
    kv_efficiency: float = Field(0.63, gt=0, le=1)
    #: Share of the dense bf16 peak reached by the verified tokens' compute.
    compute_efficiency: float = Field(0.74, gt=0, le=1)
    #: Fixed seconds per layer and step: small kernels and the gaps between kernels. Each GPU
    #: of a tensor-parallel group runs every layer, so it does not divide.
    layer_overhead_s: float = Field(1.06e-4, ge=0)
    #: Fixed seconds per step beyond the layers (the CPU's scheduling where not overlapped).
    step_overhead_s: float = Field(0.0, ge=0)

    @property
    def gpus(self) -> int:
        if self.tensor_parallel is not None:
            return self.tensor_parallel
        n = 1
        while self.model.weight_bytes > self.weights_share * self.gpu.memory_bytes * n:
            n *= 2
        return n

    @property
    def kv_capacity_tokens(self) -> float:
        """Tokens of KV cache the engine holds."""
        free = self.gpus * self.gpu.memory_bytes - self.model.weight_bytes
        return max(0.0, free * self.kv_share / self.model.kv_bytes_per_token)

    def batch_for(self, concurrency: int, context: float) -> int:
        """Requests decoding together: at most ``concurrency``, at most what the KV cache holds."""
        fits = int(self.kv_capacity_tokens // max(context, 1.0))
        return max(1, min(concurrency, fits))

    def step_seconds(self, batch: int, verified: float, context: float) -> float:
        """One decoding step of ``batch`` requests, each verifying ``verified`` tokens
        (1 + its draft length) at ``context`` tokens of context."""
        n = self.gpus
        bandwidth = self.gpu.memory_bandwidth
        t_weights = self.model.weight_bytes / n / (bandwidth * self.memory_efficiency)
        t_kv = batch * context * self.model.kv_bytes_per_token / n / (bandwidth * self.kv_efficiency)
        flops = batch * verified * self.model.flops_per_token(context) / n
        t_compute = flops / (self.gpu.peak_flops * self.compute_efficiency)
        overhead = self.step_overhead_s + self.model.layers * self.layer_overhead_s
        return overhead + t_weights + t_kv + t_compute

    def tokens_per_second(
        self,
        concurrency: int,
        context: float,
        emitted: float = 1.0,
        verified: float = 1.0,
        drafter_s: float = 0.0,
    ) -> float:
        """Output tokens per second of the engine at ``concurrency`` requests in flight.

        ``emitted``/``verified``: tokens per request and step (1 and 1 without
        speculation); ``drafter_s``: the drafter's time per request and step.
        """
        return self.batch_tokens_per_second(self.batch_for(concurrency, context), context, emitted, verified, drafter_s)

    def batch_tokens_per_second(
        self, batch: int, context: float, emitted: float = 1.0, verified: float = 1.0, drafter_s: float = 0.0
    ) -> float:
        """Output tokens per second of steps of ``batch`` requests (a batch the engine runs)."""
        step = self.step_seconds(batch, verified, context) + batch * drafter_s
        return batch * emitted / step


class DraftOutcomes(BaseModel):
    """How a replay's drafts fared: ``counts[(drafted, accepted)]`` proposals, one per
    request and decoding step (``drafted`` 0 where the drafter proposed nothing)."""

    model_config = ConfigDict(frozen=True)

    counts: dict[tuple[int, int], int]

    @classmethod
    def of(cls, rows: Iterable[tuple[int, int, int]]) -> DraftOutcomes:
        """From ``(drafted, accepted, count)`` rows (a replay record's ``draft_outcomes``)."""
        counts: dict[tuple[int, int], int] = {}
        for drafted, accepted, n in rows:
            if not 0 <= accepted <= drafted:
                raise ValueError(f"accepted {accepted} of a {drafted}-token draft")
            counts[(drafted, accepted)] = counts.get((drafted, accepted), 0) + n
        return cls(counts=counts)

    @property
    def proposals(self) -> int:
        return sum(self.counts.values())

    @property
    def longest(self) -> int:
        return max((d for d, _ in self.counts), default=0)

    def _mean(self, values: Mapping[tuple[int, int], int]) -> float:
        total = self.proposals
        return sum(values.values()) / total if total else 0.0

    def verified(self, cap: int | None = None) -> float:
        """Tokens a request verifies per step (its last token and its draft, cut to ``cap``)."""
        k = self.longest if cap is None else cap
        return 1.0 + self._mean({key: n * min(key[0], k) for key, n in self.counts.items()})

    def emitted(self, cap: int | None = None) -> float:
        """Tokens a request emits per step (accepted draft tokens and the bonus token)."""
        k = self.longest if cap is None else cap
        return 1.0 + self._mean({key: n * min(key[1], k) for key, n in self.counts.items()})


def parse_speed_model(spec: str) -> SpeedModel:
    """``"h100:8b"`` (a GPU of :data:`GPUS` and a model of :data:`MODELS`) as a :class:`SpeedModel`."""
    gpu, _, model = spec.lower().partition(":")
    if gpu not in GPUS or model not in MODELS:
        raise ValueError(
            f"speed model {spec!r}: expected GPU:MODEL with GPU one of {sorted(GPUS)} and MODEL one of {sorted(MODELS)}"
        )
    return SpeedModel(gpu=GPUS[gpu], model=MODELS[model])
