"""Fitting the speed model to timed steps (benchmarks/speed_fit.py), the shipped
defaults against the committed H200 measurements, and the two benchmark scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from speed_fit import (
    ShapeDims,
    StepTime,
    StepTimes,
    fit_speed_model,
    relative_errors,
)

from agentspec.draft_budget.speed_model import GPUS, MODELS, SpeedModel

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
MEASURED = [RESULTS / "h200-step-times.json", RESULTS / "h200-step-times-70b-40-layers.json"]
FIELDS = ("memory_efficiency", "kv_efficiency", "compute_efficiency", "layer_overhead_s", "step_overhead_s")


def _steps(model: SpeedModel, shape: str) -> list[StepTime]:
    return [
        StepTime(model=shape, batch=b, verified=v, context=c, seconds=model.step_seconds(b, v, c))
        for b in (1, 8, 64)
        for v in (1, 4, 16)
        for c in (1024, 8192)
    ]


def test_the_fit_recovers_the_parameters_that_made_the_times() -> None:
    truth = {
        "memory_efficiency": 0.8,
        "kv_efficiency": 0.55,
        "compute_efficiency": 0.65,
        "layer_overhead_s": 5e-5,
        "step_overhead_s": 0.0,
    }
    rows = []
    for shape in ("8b", "32b"):  # two shapes: one alone cannot tell the weights' time from the layers'
        rows += _steps(SpeedModel(gpu=GPUS["h100"], model=MODELS[shape], tensor_parallel=1, **truth), shape)
    fitted = fit_speed_model(GPUS["h100"], rows)
    for key in ("memory_efficiency", "kv_efficiency", "compute_efficiency", "step_overhead_s"):
        assert fitted[key] == pytest.approx(truth[key])
    assert fitted["layer_overhead_s"] == pytest.approx(truth["layer_overhead_s"], rel=1e-6)
    assert np.abs(relative_errors(GPUS["h100"], rows, **fitted)).max() < 1e-9


def test_a_shape_the_file_describes_is_priced_from_its_dimensions(tmp_path: Path) -> None:
    # Llama-3-8B's dimensions give agentspec.draft_budget.speed_model's 8B (8.03e9 parameters, untied embeddings).
    dims = {"hidden": 4096, "intermediate": 14336, "layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128}
    shape = ShapeDims(**dims, vocab=128256).model_shape("8b-copy")
    assert shape.params == pytest.approx(MODELS["8b"].params, rel=1e-3)
    assert shape.kv_bytes_per_token == MODELS["8b"].kv_bytes_per_token
    path = tmp_path / "cut.json"
    row = {"model": "8b-16l", "batch": 1, "verified": 1, "context": 0, "seconds": 0.01}
    path.write_text(
        json.dumps({"device": "x", "shapes": {"8b-16l": dims | {"layers": 16, "vocab": 128256}}, "rows": [row]})
    )
    shapes = StepTimes.load(path).model_shapes()
    assert shapes["8b-16l"].layers == 16
    assert shapes["8b-16l"].params == pytest.approx(16 * 218_103_808 + 2 * 128256 * 4096)


def test_the_defaults_are_the_fit_of_the_committed_h200_measurements() -> None:
    rows: list[StepTime] = []
    shapes = {}
    for path in MEASURED:
        times = StepTimes.load(path)
        assert "H200" in times.device
        rows += times.rows
        shapes |= times.model_shapes()
    assert {r.model for r in rows} == {"8b", "32b", "70b-40l"}
    fitted = fit_speed_model(GPUS["h200"], rows, shapes)
    defaults = {k: SpeedModel.model_fields[k].default for k in FIELDS}
    for key in ("memory_efficiency", "kv_efficiency", "compute_efficiency", "step_overhead_s"):
        assert defaults[key] == pytest.approx(fitted[key])
    assert defaults["layer_overhead_s"] == pytest.approx(fitted["layer_overhead_s"], abs=1e-6)
    errors = relative_errors(GPUS["h200"], rows, shapes)
    assert np.sqrt(np.mean(errors**2)) < 0.05  # docs/speed.md reports 4.8%


def test_bad_input_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no step times"):
        fit_speed_model(GPUS["h200"], [])
    odd = tmp_path / "odd.json"
    odd.write_text(
        json.dumps({"device": "x", "rows": [{"model": "13b", "batch": 1, "verified": 1, "context": 0, "seconds": 1}]})
    )
    with pytest.raises(
        ValueError, match=r"model shapes \['13b'\] are neither in agentspec.draft_budget.speed_model.MODELS"
    ):
        StepTimes.load(odd)
    odd.write_text(json.dumps({"device": "x", "rows": [{"model": "8b", "batch": 0, "verified": 1, "context": 0}]}))
    with pytest.raises(ValueError, match="batch"):
        StepTimes.load(odd)


def test_the_step_timer_runs_its_dry_run_on_the_cpu(tmp_path: Path) -> None:
    # The timer is for a CUDA GPU (none here); its CPU dry run takes the same code path at a
    # tiny shape, including the split attention it checks against plain attention first.
    out = tmp_path / "steps.json"
    script = ROOT / "benchmarks" / "gpu_step_time.py"
    args = ["--device", "cpu", "--models", "tiny", "--batch", "1,3", "--verified", "1,4", "--context", "512"]
    done = subprocess.run(
        [sys.executable, str(script), *args, "--repeats", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "split attention vs plain attention: max difference" in done.stdout
    record = json.loads(out.read_text())
    assert [(r["batch"], r["verified"]) for r in record["rows"]] == [(1, 1), (1, 4), (3, 1), (3, 4)]
    assert all(r["seconds"] > 0 and r["context"] == 512 for r in record["rows"])


def test_the_calibration_script_reports_the_committed_measurements() -> None:
    script = ROOT / "benchmarks" / "speed_calibration.py"
    done = subprocess.run(
        [sys.executable, str(script), *map(str, MEASURED), "--gpu", "h200"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "h200-step-times.json: 85 steps timed on NVIDIA H200" in text
    assert "h200-step-times-70b-40-layers.json: 40 steps timed on NVIDIA H200" in text
    assert "defaults memory_efficiency 1.00, kv_efficiency 0.63" in text and "refit" in text
    for held_out in ("8b", "32b", "70b-40l", "context 2048", "context 8192"):
        assert f"held out: fitted without {held_out}, on it: RMS" in text
    assert "textbook roofline, layers x overhead + max(memory, compute), best fit: RMS" in text
