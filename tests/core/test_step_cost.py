"""The step cost an engine measures on itself (agentspec.draft_budget.step_cost): the fit
recovers the cost curve it is fed, stays non-negative, shrugs off a stalled step, and the
profile file round-trips or is refused naming what is wrong."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec.draft_budget.step_cost import FLAT_PROFILE, StepCostEstimator, StepCostProfile, read_cost_profile

CPU = StepCostProfile(fixed_s=0.020, per_request_s=0.002, per_token_s=0.004)


def _timed(truth: StepCostProfile, steps: int = 400, noise: float = 0.03, seed: int = 0) -> StepCostEstimator:
    rng = random.Random(seed)
    est = StepCostEstimator()
    for _ in range(steps):
        batch = rng.randint(1, 16)
        tokens = batch + sum(rng.randint(0, 8) for _ in range(batch))
        est.observe(batch, tokens, truth.step_seconds(batch, tokens) * (1 + rng.uniform(-noise, noise)))
    return est


def test_the_fit_recovers_the_cost_curve_it_times() -> None:
    fit = _timed(CPU).profile()
    assert fit.source == "measured" and fit.steps == 400
    assert fit.fixed_s == pytest.approx(CPU.fixed_s, rel=0.1)
    assert fit.per_request_s == pytest.approx(CPU.per_request_s, rel=0.2)
    assert fit.per_token_s == pytest.approx(CPU.per_token_s, rel=0.05)


def test_a_term_the_machine_does_not_have_is_fitted_at_zero_not_below() -> None:
    # A GPU at small batches: the step is its fixed cost; tokens and requests add nothing.
    fit = _timed(StepCostProfile(fixed_s=0.010)).profile()
    assert fit.per_token_s >= 0 and fit.per_request_s >= 0
    assert fit.per_token_s < 2e-5 and fit.fixed_s == pytest.approx(0.010, rel=0.05)


def test_a_stalled_step_moves_the_fit_little() -> None:
    est = _timed(CPU)
    before = est.profile().per_token_s
    est.observe(4, 20, 30.0)  # a 30 s pause inside one step
    assert est.profile().per_token_s == pytest.approx(before, rel=0.05)


def test_before_any_step_the_prior_is_the_fit() -> None:
    est = StepCostEstimator(CPU)
    assert est.profile() == CPU
    assert StepCostEstimator().profile().per_token_s == 0.0  # the flat prior: tokens are free


def test_the_drafter_pass_is_the_slope_between_calls_with_and_without_passes() -> None:
    est = StepCostEstimator()
    assert est.drafter_pass_s == 0.0
    for _ in range(50):
        est.observe_drafter(0, 0.004)
        est.observe_drafter(3, 0.004 + 3 * 0.006)
    assert est.drafter_pass_s == pytest.approx(0.006, rel=1e-6)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 64), st.integers(0, 512), st.floats(1e-4, 10.0, allow_nan=False)),
        min_size=1,
        max_size=40,
    )
)
def test_any_timed_steps_give_a_non_negative_profile(steps: list[tuple[int, int, float]]) -> None:
    est = StepCostEstimator()
    for batch, extra, seconds in steps:
        est.observe(batch, batch + extra, seconds)
    fit = est.profile()
    assert min(fit.fixed_s, fit.per_request_s, fit.per_token_s) >= 0
    assert fit.step_seconds(1, 1) > 0


def test_the_profile_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "cost" / "profile.json"
    fit = _timed(CPU).profile()
    fit.write(path)
    assert read_cost_profile(path) == fit
    assert FLAT_PROFILE.source == "flat"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        (json.dumps({"fixed_s": -1.0}), "fixed_s"),
        (json.dumps({"fixed_s": 0.01, "per_token": 0.1}), "per_token"),
    ],
)
def test_a_bad_profile_file_is_refused_naming_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "profile.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"cost profile {path}.*{problem}"):
        read_cost_profile(path)
    with pytest.raises(ValueError, match="cannot read"):
        read_cost_profile(tmp_path / "missing.json")
