"""Fit the speed model's efficiencies and overhead to decoding steps timed on a GPU.

``benchmarks/gpu_step_time.py`` times Llama-shaped decoding steps on a GPU and writes them
as JSON (:class:`StepTimes`). :func:`fit_speed_model` finds the
:class:`~agentspec.draft_budget.speed_model.SpeedModel` whose estimates come closest to those times (least
squares on the relative error), and :func:`relative_errors` says how close any speed model
comes. The fit is a grid over the three efficiencies with the per-layer overhead solved in
closed form at each point: four parameters and tens of measurements need nothing heavier.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from agentspec.draft_budget.speed_model import MODELS, GpuSpec, ModelShape, SpeedModel

__all__ = ["ShapeDims", "StepTime", "StepTimes", "fit_speed_model", "relative_errors", "step_parts"]


class StepTime(BaseModel):
    """One decoding step timed on a GPU: ``batch`` requests, each verifying ``verified``
    tokens over ``context`` tokens of KV cache, on the model shape named ``model``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str
    batch: PositiveInt
    verified: PositiveInt
    context: int = Field(ge=0)
    seconds: PositiveFloat


class ShapeDims(BaseModel):
    """A timed shape's dimensions, as ``gpu_step_time.py`` records them."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    hidden: PositiveInt
    intermediate: PositiveInt
    layers: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    vocab: PositiveInt

    def model_shape(self, name: str) -> ModelShape:
        """As :class:`~agentspec.draft_budget.speed_model.ModelShape`: a Llama-style layer (QKV, output
        projection, gated MLP) and untied embedding and output matrices."""
        per_layer = (
            self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
            + self.heads * self.head_dim * self.hidden
            + 3 * self.hidden * self.intermediate
        )
        return ModelShape(
            name=name,
            params=self.layers * per_layer + 2 * self.vocab * self.hidden,
            layers=self.layers,
            heads=self.heads,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
        )


class StepTimes(BaseModel):
    """What ``benchmarks/gpu_step_time.py`` writes: the device, its probes, the shapes
    it timed and the steps."""

    model_config = ConfigDict(extra="ignore")

    device: str
    probe: dict[str, float] = Field(default_factory=dict)
    shapes: dict[str, ShapeDims] = Field(default_factory=dict)
    rows: list[StepTime]

    @classmethod
    def load(cls, path: str | Path) -> StepTimes:
        times = cls.model_validate(json.loads(Path(path).read_text()))
        unknown = sorted({row.model for row in times.rows} - set(MODELS) - set(times.shapes))
        if unknown:
            raise ValueError(
                f"{path}: model shapes {unknown} are neither in agentspec.draft_budget.speed_model.MODELS"
                f" {sorted(MODELS)} nor described in the file's shapes"
            )
        return times

    def model_shapes(self) -> dict[str, ModelShape]:
        """The shape of every row's model: :data:`~agentspec.draft_budget.speed_model.MODELS`' for the names it
        has (the shapes the speed model estimates with), the file's own for the others."""
        names = {row.model for row in self.rows}
        return {n: MODELS[n] if n in MODELS else self.shapes[n].model_shape(n) for n in names}


def relative_errors(
    gpu: GpuSpec, rows: Sequence[StepTime], shapes: Mapping[str, ModelShape] = MODELS, **fields: float
) -> np.ndarray:
    """``estimate / measured - 1`` for each row, with the speed model's ``fields``
    (efficiencies, overhead) as given and its defaults for the rest; one GPU, as the steps
    were timed."""
    return np.array(
        [
            SpeedModel(gpu=gpu, model=shapes[row.model], tensor_parallel=1, **fields).step_seconds(
                row.batch, row.verified, row.context
            )
            / row.seconds
            - 1
            for row in rows
        ]
    )


def step_parts(
    gpu: GpuSpec, rows: Sequence[StepTime], shapes: Mapping[str, ModelShape]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seconds each row's weights, KV cache and compute take at efficiency 1, and its layers."""
    weights, kv, compute, layers = [], [], [], []
    for row in rows:
        shape = shapes[row.model]
        weights.append(shape.weight_bytes / gpu.memory_bandwidth)
        kv.append(row.batch * row.context * shape.kv_bytes_per_token / gpu.memory_bandwidth)
        compute.append(row.batch * row.verified * shape.flops_per_token(row.context) / gpu.peak_flops)
        layers.append(shape.layers)
    return np.array(weights), np.array(kv), np.array(compute), np.array(layers, dtype=float)


def fit_speed_model(
    gpu: GpuSpec, rows: Sequence[StepTime], shapes: Mapping[str, ModelShape] = MODELS, step: float = 0.01
) -> dict[str, float]:
    """The efficiencies and per-layer overhead (SpeedModel's field names) that minimise the
    mean squared relative error over ``rows``; efficiencies on a grid of ``step`` in (0, 1].

    The steps were timed without a CPU-side scheduler, so ``step_overhead_s`` is 0. The
    rows must span two model shapes or more whose weights per layer differ: within one
    shape, the weights' time and the layers' overhead are both constant."""
    if not rows:
        raise ValueError("no step times to fit")
    weights, kv, compute, layers = step_parts(gpu, rows, shapes)
    measured = np.array([row.seconds for row in rows])
    grid = np.arange(step, 1.0 + step / 2, step)
    w = 1.0 / measured**2
    best: tuple[float, dict[str, float]] | None = None
    for memory_efficiency in grid:
        # Every kv and compute efficiency at once: axes kv, compute, rows.
        core = weights / memory_efficiency + kv / grid[:, None, None] + compute / grid[None, :, None]
        # For fixed efficiencies the error is quadratic in the per-layer overhead: solve it,
        # keep it >= 0.
        per_layer = np.clip(((measured - core) * w * layers).sum(-1) / (w * layers**2).sum(), 0.0, None)
        mse = (((per_layer[..., None] * layers + core) / measured - 1.0) ** 2).mean(-1)
        j, k = np.unravel_index(np.argmin(mse), mse.shape)
        if best is None or mse[j, k] < best[0]:
            best = (
                float(mse[j, k]),
                {
                    "memory_efficiency": round(float(memory_efficiency), 6),
                    "kv_efficiency": round(float(grid[j]), 6),
                    "compute_efficiency": round(float(grid[k]), 6),
                    "layer_overhead_s": float(per_layer[j, k]),
                    "step_overhead_s": 0.0,
                },
            )
    assert best is not None
    return best[1]
