"""A fitted chooser: each candidate draft's accepted tokens predicted token by token.

The target accepts a draft's tokens up to its first mistake, so the accepted count of a
draft is a survival time. :class:`SurvivalChooser` models the chance that token ``i`` is
accepted, given that the tokens before it were, as a logistic function of what the tree
and the call know (:data:`FEATURES`): the token's path and conditional probability and its
place in the draft; the draft's level, that level's calibration weight and its match
length; where the call is in its output and how its previous draft fared; and whether the
other levels' drafts agree on the first token. A draft's expected accepted tokens are then
``sum_i prod_{j<=i} q_j``, and the chooser keeps the candidate with the most.

It is fitted offline on recorded steps (:meth:`SurvivalChooser.fit`, Newton's method on the
L2-penalised log-likelihood; numpy only) and judged on steps it was not fitted on:
``benchmarks/chooser_fit.py`` does both on the development set and compares it with the
index's default rule (the calibrated score).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from agentspec.index.choice import Candidate, ChoiceContext
from agentspec.index.types import Level

__all__ = ["FEATURES", "SurvivalChooser", "draft_features", "survival_rows"]

#: The per-token features, in the order of the chooser's weights.
FEATURES: tuple[str, ...] = (
    "bias",
    "log_path_prob",
    "log_cond_prob",
    "token_index",
    "log_level_weight",
    "match_len",
    "log_position",
    "last_acceptance",
    "had_last_draft",
    "agreement",
    "level_session",
    "level_group",
    "level_global",
)
_LEVEL_COLUMN = {Level.SESSION: 10, Level.GROUP: 11, Level.GLOBAL: 12}
_MIN_PROB = 1e-4  # probabilities are clipped before their log
_SCALE = 32.0  # token index and match length are divided by this (the default longest draft)


def draft_features(candidates: Sequence[Candidate], context: ChoiceContext) -> list[np.ndarray]:
    """One ``(len(draft), len(FEATURES))`` matrix per candidate."""
    firsts = [c.draft.token_ids[0] for c in candidates]
    last_acceptance = context.last_accepted / context.last_drafted if context.last_drafted else 0.0
    shared = np.zeros(len(FEATURES))
    shared[0] = 1.0
    shared[6] = np.log1p(context.position) / 8.0
    shared[7] = last_acceptance
    shared[8] = 1.0 if context.last_drafted else 0.0
    out = []
    for c in candidates:
        n = len(c.draft.token_ids)
        log_p = np.log(np.clip(np.asarray(c.draft.probs[:n], dtype=np.float64), _MIN_PROB, 1.0))
        f = np.tile(shared, (n, 1))
        f[:, 1] = log_p
        f[:, 2] = np.diff(log_p, prepend=0.0)
        f[:, 3] = np.arange(n) / _SCALE
        f[:, 4] = np.log(max(c.weight, _MIN_PROB))
        f[:, 5] = min(c.draft.match_len, _SCALE) / _SCALE
        f[:, 9] = (firsts.count(c.draft.token_ids[0]) - 1) / max(len(candidates) - 1, 1)
        if (col := _LEVEL_COLUMN.get(c.level)) is not None:
            f[:, col] = 1.0
        out.append(f)
    return out


def survival_rows(features: np.ndarray, accepted: int) -> tuple[np.ndarray, np.ndarray]:
    """The survival events of one draft the target accepted ``accepted`` tokens of: every
    accepted token (label 1) and the first rejected one (label 0), if any."""
    n = features.shape[0]
    seen = min(accepted + 1, n)
    labels = np.zeros(seen)
    labels[: min(accepted, n)] = 1.0
    return features[:seen], labels


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # stable for large |z|


class SurvivalChooser:
    """Keeps the candidate with the most expected accepted tokens under a fitted model
    (a :class:`~agentspec.index.choice.DraftChooser`)."""

    def __init__(self, weights: Sequence[float] | np.ndarray) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (len(FEATURES),):
            raise ValueError(f"need {len(FEATURES)} weights (one per feature), got shape {w.shape}")
        self.weights = w

    def expected_accepted(self, features: np.ndarray) -> float:
        """Expected accepted tokens of a draft with these per-token features."""
        return float(np.cumprod(_sigmoid(features @ self.weights)).sum())

    def choose(self, candidates: Sequence[Candidate], context: ChoiceContext) -> int:
        expected = [self.expected_accepted(f) for f in draft_features(candidates, context)]
        return int(np.argmax(expected)) if expected else -1

    def log_loss(self, x: np.ndarray, y: np.ndarray) -> float:
        """Mean negative log-likelihood of survival events ``(x, y)``."""
        q = np.clip(_sigmoid(x @ self.weights), 1e-12, 1 - 1e-12)
        return float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))

    @classmethod
    def fit(
        cls, events: Iterable[tuple[np.ndarray, np.ndarray]], l2: float = 1.0, max_iter: int = 50
    ) -> SurvivalChooser:
        """Fit to survival events (:func:`survival_rows`) by Newton's method."""
        pairs = list(events)
        if not pairs:
            raise ValueError("no survival events to fit")
        x = np.concatenate([p[0] for p in pairs])
        y = np.concatenate([p[1] for p in pairs])
        if not 0 < y.sum() < len(y):
            raise ValueError("the events need both accepted and rejected tokens")
        w = np.zeros(x.shape[1])
        penalty = l2 * np.eye(x.shape[1])
        penalty[0, 0] = 0.0  # the bias is not shrunk
        for _ in range(max_iter):
            q = _sigmoid(x @ w)
            grad = x.T @ (q - y) + penalty @ w
            hess = (x * (q * (1 - q))[:, None]).T @ x + penalty
            step = np.linalg.solve(hess, grad)
            w -= step
            if np.max(np.abs(step)) < 1e-8:
                break
        return cls(w)
