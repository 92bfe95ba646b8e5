"""Hybrid drafting: which drafter drafts a request's next step.

Two drafters can propose for a step: the session draft index (a suffix draft, free to
produce) and a model drafter (a small draft model, which costs forward passes). A request
takes the index's draft when the tokens it is expected to deliver are at least what the
model drafter is expected to deliver; otherwise the model drafter's (:func:`choose`, the
default rule). Arctic Inference's rule, selectable for comparison, takes the index's draft
when its score reaches the model drafter's draft length (:func:`choose_by_score`).

- The index's expectation is its draft's score (the sum of the tokens' estimated
  probabilities) times the level's calibration weight, as the index itself ranks drafts.
- The model drafter's is measured online (:class:`ModelDrafterEstimate`): the rate at
  which the target accepts a model-drafted token given that the ones before it were
  accepted, turned into expected accepted tokens for a draft of a given length.

The drafter's forward pass is batched, so it is skipped only for a whole step in which
no request chose it (:func:`model_runs`).

Under the cost budget (:mod:`agentspec.draft_budget.cost_budget`) both drafters' tokens are
priced in output tokens: each verified token costs ``token_price``, so a draft is worth its
expected tokens less ``token_price`` per token (:func:`net_tokens`), a model draft is no
longer than its tokens pay for (:meth:`HybridRule.paying_length`), and the model's passes
run only when what the requests that chose it gain over their index drafts is worth
the passes (:func:`passes_pay`). At price 0 (a flat cost, or the fixed batch rule) the
choice is the one above.

No vLLM here: the engine adapter (:mod:`agentspec.engine.worker.hybrid_drafting`) applies
these rules.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Literal

__all__ = [
    "DraftPath",
    "HybridRule",
    "ModelDrafterEstimate",
    "choose",
    "choose_by_score",
    "model_runs",
    "net_tokens",
    "passes_pay",
]


class DraftPath(str, enum.Enum):
    """Where a request's draft for one step came from."""

    SUFFIX = "suffix"  # the session draft index
    MODEL = "model"  # the model drafter
    NONE = "none"  # no draft: the step decodes one token


class ModelDrafterEstimate:
    """Online estimate of what a model draft delivers.

    A draft of ``n`` tokens of which the target accepted ``a`` tested ``a`` positions
    that passed and, if ``a < n``, one that failed; the conditional acceptance rate is
    passed / tested, in exponentially decayed sums so that it follows the traffic
    (``halflife`` in tested positions). Before anything is observed it is ``prior``,
    weighted as ``prior_weight`` positions, so the drafter is tried before it is judged.
    """

    def __init__(self, prior: float = 0.5, prior_weight: float = 8.0, halflife: float = 2048.0) -> None:
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior must be in [0, 1], got {prior}")
        if prior_weight <= 0 or halflife <= 0:
            raise ValueError("prior_weight and halflife must be positive")
        self._passed = prior * prior_weight
        self._tested = prior_weight
        self._decay = 0.5 ** (1.0 / halflife)

    @property
    def acceptance(self) -> float:
        """The estimated probability that the target accepts the next model-drafted token,
        given that the previous ones were accepted."""
        return self._passed / self._tested

    def observe(self, drafted: int, accepted: int) -> None:
        """The target accepted ``accepted`` of a model draft of ``drafted`` tokens."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got accepted={accepted}, drafted={drafted}")
        tested = accepted + (1 if accepted < drafted else 0)
        if tested == 0:
            return
        decay = self._decay**tested
        self._passed = self._passed * decay + accepted
        self._tested = self._tested * decay + tested

    def expected_accepted(self, length: int) -> float:
        """Expected accepted tokens of a model draft ``length`` tokens long:
        ``sum(p**i for i in 1..length)`` with ``p`` the conditional acceptance."""
        p = self.acceptance
        if length <= 0 or p <= 0.0:
            return 0.0
        if p >= 1.0:
            return float(length)
        return p * (1.0 - p**length) / (1.0 - p)


def choose(suffix_tokens: int, suffix_expected: float, model_tokens: int, model_expected: float) -> DraftPath:
    """The path for one request and step.

    ``suffix_tokens`` / ``model_tokens``: the length each drafter may draft (0: it has
    nothing, or may not draft); ``*_expected``: the tokens each is expected to deliver.
    The index's draft wins ties: it costs nothing to produce.
    """
    if suffix_tokens > 0 and (model_tokens <= 0 or suffix_expected >= model_expected):
        return DraftPath.SUFFIX
    if model_tokens > 0:
        return DraftPath.MODEL
    return DraftPath.NONE


def choose_by_score(suffix_tokens: int, suffix_score: float, model_tokens: int) -> DraftPath:
    """The path by Arctic Inference's hybrid rule: the index's draft when its score (the
    sum of its tokens' estimated probabilities, uncalibrated) reaches the model drafter's
    draft length ``model_tokens``, else the model's. What the model drafter has delivered
    does not enter."""
    if suffix_tokens > 0 and (model_tokens <= 0 or suffix_score >= model_tokens):
        return DraftPath.SUFFIX
    if model_tokens > 0:
        return DraftPath.MODEL
    return DraftPath.NONE


def model_runs(paths: Iterable[DraftPath]) -> bool:
    """Whether a step needs the model drafter's draft passes: some request chose it."""
    return any(path is DraftPath.MODEL for path in paths)


def net_tokens(expected: float, length: int, token_price: float) -> float:
    """What a draft of ``length`` tokens expected to deliver ``expected`` is worth, in
    output tokens, once its verification is paid (``token_price`` per token)."""
    return expected - token_price * length


def passes_pay(gains: Iterable[float], passes: int, pass_price: float) -> bool:
    """Whether ``passes`` model-drafter passes, ``pass_price`` output tokens each, are worth
    the net tokens the requests that chose the model gain over their index drafts."""
    return passes <= 0 or sum(gains) >= passes * pass_price


class HybridRule:
    """One engine's choice between the index and the model drafter, step after step: the
    configured rule (``"expected"``: :func:`choose`; ``"score"``: :func:`choose_by_score`)
    and the online estimate the default rule reads, fed with the model drafts' outcomes.

    The vLLM proposer (:mod:`agentspec.engine.worker.hybrid_drafting`) and the replay's
    hybrid (:mod:`agentspec.replay.model_drafting`) both decide through it.
    """

    def __init__(
        self, rule: Literal["expected", "score"] = "expected", estimate: ModelDrafterEstimate | None = None
    ) -> None:
        if rule not in ("expected", "score"):
            raise ValueError(f"unknown hybrid rule {rule!r}; use expected or score")
        self.rule = rule
        self.estimate = estimate if estimate is not None else ModelDrafterEstimate()

    def model_expected(self, model_cap: int) -> float:
        """What a model draft of ``model_cap`` tokens is expected to deliver now."""
        return self.estimate.expected_accepted(model_cap)

    def paying_length(self, model_cap: int, token_price: float) -> int:
        """The longest model draft, at most ``model_cap``, whose last token's path
        probability (``acceptance ** n``) still pays its verification, ``token_price``."""
        if token_price <= 0.0:
            return model_cap
        p, n, path = self.estimate.acceptance, 0, 1.0
        while n < model_cap and path * p >= token_price:
            n, path = n + 1, path * p
        return n

    def choose(
        self, suffix_tokens: int, suffix_score: float, suffix_expected: float, model_tokens: int, model_expected: float
    ) -> DraftPath:
        """The path for one request and step (arguments as :func:`choose`'s, plus the index
        draft's uncalibrated ``suffix_score`` for the score rule)."""
        if self.rule == "score":
            return choose_by_score(suffix_tokens, suffix_score, model_tokens)
        return choose(suffix_tokens, suffix_expected, model_tokens, model_expected)

    def observe_model(self, drafted: int, accepted: int) -> None:
        """The target accepted ``accepted`` of a model draft of ``drafted`` tokens."""
        self.estimate.observe(drafted, accepted)
