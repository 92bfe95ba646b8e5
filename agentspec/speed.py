"""A roofline model of a vLLM engine's decoding step, to estimate tokens/s at batch sizes.

A decoding step runs the target model once over every token the batch verifies: for each
request, its last emitted token plus its draft. On a GPU the step is bound by memory
traffic or by compute, whichever is slower (the roofline). The memory traffic is the
weights once per step and each request's KV cache once per step. The compute is two FLOPs
per weight per verified token, plus attention over the context. vLLM adds a fixed cost per
step (scheduling, sampling, launches). A drafter adds its own time, on the critical path::

    t_step   = overhead + max(bytes / (bandwidth * memory_efficiency),
                              flops / (peak_flops * compute_efficiency)) + drafter
    bytes    = weight_bytes + batch * context * kv_bytes_per_token
    flops    = batch * verified * (2 * params + 4 * layers * heads * head_dim * context)
    tokens/s = batch * emitted / t_step

``verified`` and ``emitted`` are per request and step. With a draft capped at ``k``
tokens they come from the drafts a replay measured (:class:`DraftOutcomes`): a draft cut
to its first ``k`` tokens keeps ``min(accepted, k)`` of them, because acceptance is a
prefix. The batch is what fits: requests whose KV cache does not fit in the GPU's memory
wait, as they do in vLLM, so at long contexts more concurrency adds no batch.

Assumptions (see docs/speed.md): bf16 weights and KV cache; tensor parallelism divides
weights, KV and FLOPs evenly and costs nothing more; prefill is left out (it is the same
with and without speculation). The efficiencies and the overhead are named fields, so a
calibration on a real GPU can replace them.
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
    memory_efficiency: float = Field(0.75, gt=0, le=1)
    compute_efficiency: float = Field(0.6, gt=0, le=1)
    step_overhead_s: float = Field(1e-3, ge=0)

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
        memory = (self.model.weight_bytes + batch * context * self.model.kv_bytes_per_token) / n
        flops = batch * verified * self.model.flops_per_token(context) / n
        t_memory = memory / (self.gpu.memory_bandwidth * self.memory_efficiency)
        t_compute = flops / (self.gpu.peak_flops * self.compute_efficiency)
        return self.step_overhead_s + max(t_memory, t_compute)

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
