"""The roofline speed model (agentspec.draft_budget.speed_model): hand-computed cases, monotonic in the obvious
inputs, and draft outcomes cut to a cap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentspec.draft_budget.speed_model import (
    GPUS,
    MODELS,
    DraftOutcomes,
    GpuSpec,
    ModelShape,
    SpeedModel,
    parse_speed_model,
)

# Round numbers, so the expected times are easy to check by hand.
GPU = GpuSpec(name="toy", memory_bandwidth=1e12, peak_flops=100e12, memory_bytes=100e9)
MODEL = ModelShape(name="toy", params=10e9, layers=10, heads=8, kv_heads=2, head_dim=100)
TOY = SpeedModel(
    gpu=GPU,
    model=MODEL,
    memory_efficiency=1.0,
    kv_efficiency=1.0,
    compute_efficiency=1.0,
    layer_overhead_s=0.0,
    step_overhead_s=0.0,
)


def test_hand_computed_shapes() -> None:
    assert MODEL.weight_bytes == 20e9
    assert MODEL.kv_bytes_per_token == 2 * 10 * 2 * 100 * 2 == 8000
    assert MODEL.flops_per_token(0) == 20e9
    assert MODEL.flops_per_token(1000) == 20e9 + 4 * 10 * 8 * 100 * 1000
    # Llama-3-8B: 128 KiB of KV cache per token in bf16.
    assert MODELS["8b"].kv_bytes_per_token == 131072


def test_hand_computed_memory_bound_step() -> None:
    # Batch 1, one token, no context: 20 GB of weights at 1 TB/s = 20 ms, plus 20 GFLOP of
    # compute at 100 TFLOP/s = 0.2 ms.
    assert TOY.step_seconds(1, 1.0, 0.0) == pytest.approx(0.0202)
    # 10 requests at 10k context: 10 * 10k * 8 kB = 0.8 GB of KV (0.8 ms), and 10 tokens of
    # 20 GFLOP + 4 * 10 * 8 * 100 * 10k FLOP of attention (2.032 ms).
    assert TOY.step_seconds(10, 1.0, 10_000) == pytest.approx(0.020 + 0.0008 + 0.002032)
    with_overhead = TOY.model_copy(update={"step_overhead_s": 0.001, "memory_efficiency": 0.5})
    assert with_overhead.step_seconds(1, 1.0, 0.0) == pytest.approx(0.001 + 0.040 + 0.0002)
    # The per-layer overhead counts every layer, on each GPU of a tensor-parallel group.
    layered = TOY.model_copy(update={"layer_overhead_s": 1e-4})
    assert layered.step_seconds(1, 1.0, 0.0) == pytest.approx(10 * 1e-4 + 0.0202)
    split = layered.model_copy(update={"tensor_parallel": 2})
    assert split.step_seconds(1, 1.0, 0.0) == pytest.approx(10 * 1e-4 + 0.0202 / 2)
    # The KV cache's efficiency applies to the KV traffic alone.
    slow_kv = TOY.model_copy(update={"kv_efficiency": 0.5})
    assert slow_kv.step_seconds(10, 1.0, 10_000) == pytest.approx(0.020 + 0.0016 + 0.002032)


def test_hand_computed_compute_bound_step() -> None:
    # 100 requests verifying 10 tokens each: 1000 tokens * 20 GFLOP = 20 TFLOP at 100 TFLOP/s
    # (200 ms), after the weights' 20 ms: the parts add, they do not hide each other.
    assert TOY.step_seconds(100, 10.0, 0.0) == pytest.approx(0.22)
    # 1000 tokens/step over a 0.22 s step, each request emitting 4 of its 10.
    assert TOY.tokens_per_second(100, 0.0, emitted=4.0, verified=10.0) == pytest.approx(100 * 4 / 0.22)


def test_the_kv_cache_bounds_the_batch() -> None:
    # 100 GB - 20 GB of weights, 85% of it for KV: 68 GB / 8 kB = 8.5M tokens.
    assert TOY.kv_capacity_tokens == pytest.approx(8.5e6)
    assert TOY.batch_for(128, 100_000) == 85
    assert TOY.batch_for(8, 100_000) == 8
    assert TOY.batch_for(4, 1e9) == 1  # one request always runs
    assert TOY.tokens_per_second(128, 100_000) == TOY.tokens_per_second(85, 100_000)


def test_tensor_parallel_is_the_fewest_gpus_that_hold_the_weights() -> None:
    assert parse_speed_model("h100:8b").gpus == 1
    assert parse_speed_model("h100:32b").gpus == 2  # 65.6 GB > 60% of 80 GB
    assert parse_speed_model("h100:70b").gpus == 4
    assert parse_speed_model("h200:70b").gpus == 2
    assert SpeedModel(gpu=GPUS["h100"], model=MODELS["70b"], tensor_parallel=8).gpus == 8
    with pytest.raises(ValueError, match="GPU:MODEL"):
        parse_speed_model("a100:8b")
    with pytest.raises(ValueError, match="GPU:MODEL"):
        parse_speed_model("h100")


@given(
    batch=st.integers(1, 256),
    verified=st.floats(1.0, 64.0),
    context=st.floats(0.0, 100_000.0),
    more=st.floats(0.01, 10.0),
)
def test_step_time_grows_with_batch_verified_tokens_and_context(
    batch: int, verified: float, context: float, more: float
) -> None:
    model = parse_speed_model("h100:8b")
    t = model.step_seconds(batch, verified, context)
    assert model.step_seconds(batch + 1, verified, context) >= t
    assert model.step_seconds(batch, verified + more, context) >= t
    assert model.step_seconds(batch, verified, context + 1000 * more) >= t
    assert parse_speed_model("h200:8b").step_seconds(batch, verified, context) <= t  # more bandwidth
    assert (
        parse_speed_model("h100:32b").step_seconds(batch, verified, context)
        >= model.step_seconds(batch, verified, context) * 0.5
    )  # two GPUs for four times the weights: never twice as fast


@given(emitted=st.floats(1.0, 30.0), drafter=st.floats(0.0, 1e-4), concurrency=st.integers(1, 128))
def test_tokens_per_second_rises_with_emitted_tokens_and_falls_with_drafter_time(
    emitted: float, drafter: float, concurrency: int
) -> None:
    model = parse_speed_model("h100:8b")
    base = model.tokens_per_second(concurrency, 4000, emitted=emitted, verified=8.0, drafter_s=drafter)
    assert model.tokens_per_second(concurrency, 4000, emitted=emitted + 1, verified=8.0, drafter_s=drafter) > base
    assert model.tokens_per_second(concurrency, 4000, emitted=emitted, verified=8.0, drafter_s=drafter + 1e-5) < base


def test_draft_outcomes_cut_to_a_cap() -> None:
    # Four proposals: nothing drafted; 4 drafted, 4 accepted; 8 drafted, 2 accepted; 8 drafted, 8 accepted.
    outcomes = DraftOutcomes.of([(0, 0, 1), (4, 4, 1), (8, 2, 1), (8, 8, 1)])
    assert outcomes.proposals == 4 and outcomes.longest == 8
    assert outcomes.verified() == 1 + (0 + 4 + 8 + 8) / 4
    assert outcomes.emitted() == 1 + (0 + 4 + 2 + 8) / 4
    # Cut to 3 tokens: a draft keeps min(accepted, 3).
    assert outcomes.verified(3) == 1 + (0 + 3 + 3 + 3) / 4
    assert outcomes.emitted(3) == 1 + (0 + 3 + 2 + 3) / 4
    assert outcomes.verified(0) == outcomes.emitted(0) == 1.0
    assert DraftOutcomes.of([]).emitted() == 1.0
    with pytest.raises(ValueError, match="accepted 5 of a 4-token draft"):
        DraftOutcomes.of([(4, 5, 1)])


@given(st.lists(st.tuples(st.integers(0, 32), st.integers(0, 32), st.integers(1, 50)), min_size=1, max_size=40))
def test_emitted_never_exceeds_verified_and_both_grow_with_the_cap(rows: list[tuple[int, int, int]]) -> None:
    outcomes = DraftOutcomes.of([(max(d, a), min(d, a), n) for d, a, n in rows])
    previous = (1.0, 1.0)
    for cap in range(34):
        e, v = outcomes.emitted(cap), outcomes.verified(cap)
        assert 1.0 <= e <= v
        assert e >= previous[0] and v >= previous[1]
        previous = (e, v)
