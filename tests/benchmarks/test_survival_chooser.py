"""The survival chooser fitted offline (benchmarks/survival_chooser.py, research code that
benchmarks/chooser_fit.py fits and judges)."""

from __future__ import annotations

import numpy as np
import pytest
from survival_chooser import FEATURES, SurvivalChooser, draft_features, survival_rows

from agentspec.index.choice import Candidate, ChoiceContext
from agentspec.index.corpus import TreeDraft
from agentspec.index.types import Level

START = ChoiceContext(position=0, last_drafted=0, last_accepted=0)


def candidate(tokens: list[int], probs: list[float], level: Level = Level.CALL, weight: float = 1.0, match: int = 4):
    return Candidate(TreeDraft(tokens, probs, float(sum(probs)), match), level, weight)


def test_expected_accepted_tokens_by_hand():
    features = np.zeros((3, len(FEATURES)))
    features[:, 0] = 1.0  # the bias column
    assert SurvivalChooser(np.zeros(len(FEATURES))).expected_accepted(features) == pytest.approx(0.5 + 0.25 + 0.125)
    sure = np.zeros(len(FEATURES))
    sure[0] = 50.0  # every token survives
    assert SurvivalChooser(sure).expected_accepted(features) == pytest.approx(3.0)


def test_survival_rows_are_the_accepted_tokens_and_the_first_rejected_one():
    f = np.arange(5 * len(FEATURES), dtype=float).reshape(5, len(FEATURES))
    x, y = survival_rows(f, 2)
    assert y.tolist() == [1.0, 1.0, 0.0] and np.array_equal(x, f[:3])
    x, y = survival_rows(f, 5)  # wholly accepted: no rejection seen
    assert y.tolist() == [1.0] * 5 and len(x) == 5


def test_features_describe_the_draft_and_the_call():
    cands = [
        candidate([1, 2], [0.9, 0.45], Level.CALL, weight=0.8, match=16),
        candidate([1, 5], [0.5, 0.5], Level.GLOBAL, weight=0.5),
        candidate([6], [1.0], Level.GROUP),
    ]
    f = draft_features(cands, ChoiceContext(position=10, last_drafted=4, last_accepted=1))
    col = {name: i for i, name in enumerate(FEATURES)}
    assert [m.shape for m in f] == [(2, len(FEATURES)), (2, len(FEATURES)), (1, len(FEATURES))]
    assert f[0][:, col["log_path_prob"]] == pytest.approx(np.log([0.9, 0.45]))
    assert f[0][:, col["log_cond_prob"]] == pytest.approx(np.log([0.9, 0.5]))
    assert f[0][:, col["token_index"]] == pytest.approx([0.0, 1 / 32])
    assert f[0][0, col["match_len"]] == pytest.approx(0.5)
    assert f[0][0, col["log_level_weight"]] == pytest.approx(np.log(0.8))
    assert f[0][0, col["last_acceptance"]] == pytest.approx(0.25)
    assert f[0][0, col["log_position"]] == pytest.approx(np.log1p(10) / 8)
    assert [m[0, col["agreement"]] for m in f] == [0.5, 0.5, 0.0]  # two of three start with token 1
    assert f[1][0, col["level_global"]] == 1.0 and f[1][0, col["level_group"]] == 0.0
    assert f[2][0, col["level_group"]] == 1.0
    assert not f[0][0, col["level_session"] : col["level_global"] + 1].any()


def test_fit_recovers_a_known_model():
    rng = np.random.default_rng(0)
    true_w = rng.normal(0, 0.7, len(FEATURES))
    x = rng.normal(0, 1, (20_000, len(FEATURES)))
    x[:, 0] = 1.0
    y = (rng.random(len(x)) < 1 / (1 + np.exp(-x @ true_w))).astype(float)
    fitted = SurvivalChooser.fit([(x, y)], l2=0.0)
    assert np.max(np.abs(fitted.weights - true_w)) < 0.1
    assert fitted.log_loss(x, y) <= SurvivalChooser(true_w).log_loss(x, y) + 1e-9


def test_fitted_chooser_prefers_the_draft_its_data_says_survives():
    # Survival follows the path probability: the fit must learn a positive weight for it,
    # and then choose the more probable of two otherwise equal drafts.
    rng = np.random.default_rng(1)
    events = []
    for _ in range(3000):
        p = float(rng.uniform(0.05, 1.0))
        (f,) = draft_features([candidate([1, 2, 3], [p, p * p, p**3])], START)
        accepted = int(np.sum(np.cumprod(rng.random(3) < p)))
        events.append(survival_rows(f, accepted))
    chooser = SurvivalChooser.fit(events)
    assert chooser.weights[FEATURES.index("log_cond_prob")] > 0
    pair = [candidate([1, 2, 3], [0.3, 0.09, 0.027]), candidate([4, 5, 6], [0.9, 0.81, 0.729])]
    assert chooser.choose(pair, START) == 1
    low, high = (chooser.expected_accepted(f) for f in draft_features(pair, START))
    assert high > low


def test_bad_weights_and_empty_fits_are_refused():
    with pytest.raises(ValueError, match="weights"):
        SurvivalChooser([1.0, 2.0])
    with pytest.raises(ValueError, match="no survival events"):
        SurvivalChooser.fit([])
    ones = np.ones((3, len(FEATURES)))
    with pytest.raises(ValueError, match="both accepted and rejected"):
        SurvivalChooser.fit([(ones, np.ones(3))])
