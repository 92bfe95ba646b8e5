"""How far each level's draft scores are borne out by what the target model accepts.

A suffix tree scores a draft by its own counts: the sum of the tokens' estimated
probabilities, i.e. the tokens it expects to be accepted. The estimates of different trees
are not equally honest. A session's own history predicts its next turn well; the global
corpus, whose counts come from other sessions' outputs, is overconfident (on the
development set, codet drafts from it were accepted about half as often as their scores
promised). :class:`LevelCalibration` keeps, per level, the expected and the accepted
tokens of the drafts that level supplied, and weighs a new draft's score by their ratio,
so that an overconfident level no longer wins the choice against a more specific one.
"""

from __future__ import annotations


class LevelCalibration:
    """Per-level ratio of accepted to expected draft tokens, shrunk towards 1.

    ``weight(level) = (accepted + prior) / (expected + prior)``: with little evidence the
    weight stays near 1 (the tree's own estimate); once a level's expected tokens pass
    ``window``, both sums are halved so the weight follows changes in the workload.
    """

    __slots__ = ("prior", "window", "_sums")

    def __init__(self, prior: float = 200.0, window: float = 100_000.0) -> None:
        if prior <= 0 or window <= 0:
            raise ValueError(f"prior and window must be positive, got {prior}, {window}")
        self.prior = prior
        self.window = window
        self._sums: dict[str, list[float]] = {}  # level -> [accepted, expected]

    def weight(self, level: str) -> float:
        sums = self._sums.get(level)
        if sums is None:
            return 1.0
        return (sums[0] + self.prior) / (sums[1] + self.prior)

    def observe(self, level: str, expected: float, accepted: int) -> None:
        """A draft from ``level`` whose verified tokens were expected to yield ``expected``
        accepted tokens yielded ``accepted``."""
        sums = self._sums.setdefault(level, [0.0, 0.0])
        sums[0] += accepted
        sums[1] += expected
        if sums[1] > self.window:
            sums[0] *= 0.5
            sums[1] *= 0.5

    def weights(self) -> dict[str, float]:
        """The current weight of every level that has supplied a verified draft."""
        return {level: self.weight(level) for level in self._sums}
