"""The hybrid's choice between the index's draft and a model drafter's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentspec.draft_budget.drafter_choice import DraftPath, ModelDrafterEstimate, choose, model_runs


def test_expected_accepted_tokens_by_hand() -> None:
    est = ModelDrafterEstimate(prior=0.5)
    # 0.5 + 0.25 + 0.125 + 0.0625
    assert est.expected_accepted(4) == pytest.approx(0.9375)
    assert est.expected_accepted(0) == 0.0
    assert ModelDrafterEstimate(prior=1.0).expected_accepted(5) == 5.0
    assert ModelDrafterEstimate(prior=0.0).expected_accepted(5) == 0.0


def test_observations_move_the_estimate_to_the_measured_rate() -> None:
    est = ModelDrafterEstimate(prior=0.5, prior_weight=8, halflife=1e9)
    # Drafts of 4: 3 accepted (3 passed, 1 failed), many times: rate 3/4.
    for _ in range(1000):
        est.observe(4, 3)
    assert est.acceptance == pytest.approx(0.75, abs=0.002)
    # A fully accepted draft tests only passing positions.
    full = ModelDrafterEstimate(prior=0.5, prior_weight=8, halflife=1e9)
    full.observe(4, 4)
    assert full.acceptance == pytest.approx((4 + 4) / (8 + 4))
    with pytest.raises(ValueError, match="accepted"):
        est.observe(2, 3)


def test_the_estimate_forgets_old_traffic() -> None:
    est = ModelDrafterEstimate(prior=0.5, halflife=64)
    for _ in range(500):
        est.observe(4, 4)
    assert est.acceptance > 0.99
    for _ in range(500):
        est.observe(4, 0)
    assert est.acceptance < 0.01


@given(st.floats(0.0, 1.0), st.integers(0, 32), st.integers(0, 32))
def test_expected_accepted_grows_with_length_and_acceptance(p: float, n: int, m: int) -> None:
    lo, hi = sorted((n, m))
    est = ModelDrafterEstimate(prior=p)
    assert est.expected_accepted(lo) <= est.expected_accepted(hi) + 1e-12
    assert 0.0 <= est.expected_accepted(hi) <= hi
    better = ModelDrafterEstimate(prior=min(1.0, p + 0.1))
    assert est.expected_accepted(hi) <= better.expected_accepted(hi) + 1e-12


def test_choose() -> None:
    assert choose(8, 3.0, 4, 2.0) is DraftPath.SUFFIX
    assert choose(8, 2.0, 4, 2.0) is DraftPath.SUFFIX  # ties go to the free draft
    assert choose(8, 1.0, 4, 2.0) is DraftPath.MODEL
    assert choose(0, 0.0, 4, 0.1) is DraftPath.MODEL
    assert choose(8, 0.5, 0, 0.0) is DraftPath.SUFFIX  # the model may not draft
    assert choose(0, 0.0, 0, 0.0) is DraftPath.NONE
    assert not model_runs([DraftPath.SUFFIX, DraftPath.NONE])
    assert model_runs([DraftPath.SUFFIX, DraftPath.MODEL])


def test_choose_by_score_is_arctics_rule() -> None:
    """The index's draft when its score reaches the drafter's length; its calibration and
    the drafter's measured acceptance do not enter."""
    from agentspec.draft_budget.drafter_choice import choose_by_score

    assert choose_by_score(8, 4.0, 4) is DraftPath.SUFFIX  # reaches the drafter's length
    assert choose_by_score(8, 3.9, 4) is DraftPath.MODEL
    assert choose_by_score(2, 1.8, 0) is DraftPath.SUFFIX  # the model may not draft
    assert choose_by_score(0, 0.0, 4) is DraftPath.MODEL
    assert choose_by_score(0, 0.0, 0) is DraftPath.NONE
    # Where the two rules part: a short, likely draft against a drafter expected to deliver little.
    assert choose(2, 1.8, 4, 1.0) is DraftPath.SUFFIX
    assert choose_by_score(2, 1.8, 4) is DraftPath.MODEL
