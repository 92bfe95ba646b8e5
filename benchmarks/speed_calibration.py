"""agentspec's speed model against decoding steps timed on a GPU.

    python benchmarks/speed_calibration.py benchmarks/results/h200-step-times*.json --gpu h200 [--json FILE]

The files are what ``benchmarks/gpu_step_time.py`` wrote on the GPU. For every timed step
it prints the measured time, the speed model's estimate with its defaults and the relative
error; then the RMS and largest error four ways:

- defaults: ``agentspec.draft_budget.speed_model.SpeedModel`` as shipped;
- refit: the efficiencies and per-layer overhead fitted to these steps
  (``speed_fit.fit_speed_model``, beside this script), what to set for this GPU;
- held out: fitted without one model shape (with three shapes or more) or one context,
  judged on it, to show the fit carries over to steps it did not see;
- the textbook roofline: the same terms, but the larger of memory and compute time
  instead of their sum, at its best fit.

``--json FILE`` writes the same: every step with its estimate and error, the fields and
the RMS and largest error of each way (docs/speed.md's calibration tables).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table
from speed_fit import (
    StepTime,
    StepTimes,
    fit_speed_model,
    relative_errors,
    step_parts,
)

from agentspec.draft_budget.speed_model import GPUS, GpuSpec, ModelShape, SpeedModel

console = Console()
FIELDS = ("memory_efficiency", "kv_efficiency", "compute_efficiency", "layer_overhead_s", "step_overhead_s")


def _summary(errors: np.ndarray) -> str:
    return f"RMS {np.sqrt(np.mean(errors**2)):.1%}, largest {np.max(np.abs(errors)):.1%}"


def _errors(errors: np.ndarray) -> dict[str, float]:
    return {"rms": float(np.sqrt(np.mean(errors**2))), "largest": float(np.max(np.abs(errors)))}


def _fields(fields: dict[str, float]) -> str:
    return ", ".join(f"{k} {v * 1e6:.0f} µs" if k.endswith("_s") else f"{k} {v:.2f}" for k, v in fields.items())


def _roofline_max_errors(gpu: GpuSpec, rows: list[StepTime], shapes: dict[str, ModelShape]) -> np.ndarray:
    """Relative errors of ``layers * overhead + max(memory, compute)`` at its best fit
    (grid 0.02)."""
    measured = np.array([r.seconds for r in rows])
    weights, kv, compute, layers = step_parts(gpu, rows, shapes)
    grid = np.arange(0.02, 1.01, 0.02)
    w = 1.0 / measured**2
    best = None
    for em in grid:
        for ekv in grid:
            core = np.maximum((weights / em + kv / ekv)[None, :], compute[None, :] / grid[:, None])
            overhead = np.clip(((measured - core) * w * layers).sum(-1) / (w * layers**2).sum(), 0.0, None)
            errors = (overhead[:, None] * layers + core) / measured - 1.0
            mse = (errors**2).mean(-1)
            k = int(np.argmin(mse))
            if best is None or mse[k] < best[0]:
                best = (mse[k], errors[k])
    assert best is not None
    return best[1]


def main(
    paths: Annotated[list[Path], typer.Argument(help="Step times written by gpu_step_time.py.")],
    gpu: Annotated[str, typer.Option(help=f"The GPU they were timed on: one of {sorted(GPUS)}.")] = "h200",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the comparison as JSON here.")] = None,
) -> None:
    if gpu not in GPUS:
        raise typer.BadParameter(f"unknown GPU {gpu!r}: expected one of {sorted(GPUS)}")
    spec = GPUS[gpu]
    rows: list[StepTime] = []
    shapes: dict[str, ModelShape] = {}
    for path in paths:
        times = StepTimes.load(path)
        rows += times.rows
        shapes |= times.model_shapes()
        console.print(f"{path.name}: {len(times.rows)} steps timed on {times.device}", highlight=False)
        if times.probe:
            copy = times.probe.get("copy_bytes_per_s", 0.0)
            matmul = times.probe.get("matmul_flops_per_s", 0.0)
            console.print(
                f"  probes: copy {copy / 1e12:.2f} TB/s ({copy / spec.memory_bandwidth:.0%} of {spec.name}'s"
                f" {spec.memory_bandwidth / 1e12:.2f}), bf16 matrix product {matmul / 1e12:.0f} TFLOP/s"
                f" ({matmul / spec.peak_flops:.0%} of {spec.peak_flops / 1e12:.0f})",
                highlight=False,
            )
    defaults = relative_errors(spec, rows, shapes)
    table = Table(title=f"decoding step, measured vs the speed model's defaults ({spec.name}, one GPU)")
    for col in ("model", "context", "batch", "verified", "measured ms", "estimate ms", "error"):
        table.add_column(col, justify="right")
    for row, error in zip(rows, defaults, strict=True):
        table.add_row(
            row.model,
            str(row.context),
            str(row.batch),
            str(row.verified),
            f"{row.seconds * 1e3:.2f}",
            f"{row.seconds * (1 + error) * 1e3:.2f}",
            f"{error:+.1%}",
        )
    console.print(table)

    fields = {k: SpeedModel.model_fields[k].default for k in FIELDS}
    console.print(f"defaults {_fields(fields)}: {_summary(defaults)}", highlight=False)
    fitted = fit_speed_model(spec, rows, shapes)
    console.print(
        f"refit    {_fields(fitted)}: {_summary(relative_errors(spec, rows, shapes, **fitted))}", highlight=False
    )
    held_out: list[tuple[str, list[StepTime], list[StepTime]]] = []
    models = sorted({row.model for row in rows})
    if len(models) >= 3:  # two shapes at least must remain to fit
        held_out += [(m, [r for r in rows if r.model != m], [r for r in rows if r.model == m]) for m in models]
    contexts = sorted({row.context for row in rows})
    if len(contexts) > 1:
        held_out += [
            (f"context {c}", [r for r in rows if r.context != c], [r for r in rows if r.context == c]) for c in contexts
        ]
    held_json: list[dict[str, object]] = []
    for name, seen, unseen in held_out:
        held = fit_speed_model(spec, seen, shapes)
        unseen_errors = relative_errors(spec, unseen, shapes, **held)
        console.print(f"held out: fitted without {name}, on it: {_summary(unseen_errors)}", highlight=False)
        kind = "context" if name.startswith("context ") else "model"
        held_json.append({"without": name.removeprefix("context "), "kind": kind, **_errors(unseen_errors)})
    roofline = _roofline_max_errors(spec, rows, shapes)
    console.print(
        "textbook roofline, layers x overhead + max(memory, compute), best fit: " + _summary(roofline),
        highlight=False,
    )
    if json_out is not None:
        refit_errors = relative_errors(spec, rows, shapes, **fitted)
        out = {
            "gpu": gpu,
            "files": [path.name for path in paths],
            "rows": [
                {
                    "model": row.model,
                    "context": row.context,
                    "batch": row.batch,
                    "verified": row.verified,
                    "measured_s": row.seconds,
                    "estimate_s": row.seconds * (1 + float(error)),
                    "error": float(error),
                }
                for row, error in zip(rows, defaults, strict=True)
            ],
            "defaults": {"fields": fields, **_errors(defaults)},
            "refit": {"fields": fitted, **_errors(refit_errors)},
            "held_out": held_json,
            "roofline_max": _errors(roofline),
        }
        json_out.write_text(json.dumps(out, indent=1) + "\n")
        console.print(f"wrote {json_out}", highlight=False)


if __name__ == "__main__":
    typer.run(main)
