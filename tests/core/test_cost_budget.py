"""Drafts cut where their tokens stop paying (agentspec.draft_budget.cost_budget): a flat
cost keeps long drafts and a steep one shortens them, through the real driver and index; a
model drafter's passes priced above what they add are skipped; ranks that price from what
they all see decide alike whatever their clocks say."""

from __future__ import annotations

import random

import pytest

from agentspec.draft_budget.cost_budget import CostBudget
from agentspec.draft_budget.drafter_choice import HybridRule, ModelDrafterEstimate, net_tokens, passes_pay
from agentspec.draft_budget.step_cost import StepCostProfile
from agentspec.driver import RequestDriver, RequestSpec
from agentspec.index import DraftIndex

K = 8
#: A GPU at small batches: a verified token costs 1/2000 of a step.
GPU = StepCostProfile(fixed_s=0.010, per_request_s=0.0001, per_token_s=0.000005)
#: A CPU: a verified token costs about what a decoded one does.
CPU = StepCostProfile(fixed_s=0.004, per_request_s=0.001, per_token_s=0.004)


def _trained(truth: StepCostProfile, batch: int = 4, accepted: float = 2.0) -> CostBudget:
    """A budget that has timed 300 steps of ``truth``, each request emitting ``1 + accepted``."""
    rng = random.Random(1)
    budget = CostBudget(K)
    for _ in range(300):
        verified = batch * (1 + rng.randint(0, K))
        budget.observe_timed_step(batch, verified, round(batch * (1 + accepted)), truth.step_seconds(batch, verified))
    return budget


def _driver_draft(budget: CostBudget, batch: int = 4) -> int:
    """The draft the driver makes, under ``budget``, for a session whose next tokens after
    1 2 3 went on 4 5 6 7 8 9 10 11 three times and 4 5 6 20 21 ... once: path
    probabilities 1 for three tokens, then 0.75."""
    index = DraftIndex()
    driver = RequestDriver(index, budget)
    seen = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0] * 3 + [1, 2, 3, 4, 5, 6, 20, 21, 22, 23, 24, 0]
    driver.admit("r", RequestSpec(session_id="s"))
    driver.begin("r", seen + [1, 2, 3])
    driver.budget_for(batch, K)
    draft = driver.draft("r", K)
    assert draft is not None
    return len(draft.token_ids)


def test_a_flat_cost_keeps_long_drafts_and_a_steep_one_shortens_them() -> None:
    gpu, cpu = _trained(GPU), _trained(CPU)
    assert gpu.token_price(4) < 0.05 < 0.6 < cpu.token_price(4) < 1.0
    assert _driver_draft(gpu) == K
    assert _driver_draft(cpu) == 3  # the tokens the session always continued with
    assert _driver_draft(CostBudget(K)) == K  # nothing timed yet: nothing cut


def test_the_price_rises_with_the_batch_on_a_steep_curve() -> None:
    cpu = _trained(CPU)
    assert cpu.token_price(1) < cpu.token_price(4) < cpu.token_price(32)


def test_one_step_in_explore_every_drafts_uncut_to_keep_timing_long_drafts() -> None:
    budget = _trained(CPU)
    cuts = []
    for _ in range(budget.explore_every * 2):
        assert budget.tokens_for(4) == K
        cuts.append(budget.min_prob_for(4))
    assert cuts.count(0.0) == 2
    assert all(c == pytest.approx(budget.token_price(4)) for c in cuts if c)
    frozen = CostBudget(K, CPU, learns=False)  # ranks that do not learn explore the same steps
    frozen_cuts = [frozen.tokens_for(4) and frozen.min_prob_for(4) for _ in range(budget.explore_every * 2)]
    assert [c == 0.0 for c in frozen_cuts] == [c == 0.0 for c in cuts]
    assert frozen.step_prices(4) == (0.0, 0.0) and frozen.exploring


def test_a_drafter_pass_priced_above_what_it_adds_is_skipped() -> None:
    budget = _trained(CPU)
    for _ in range(20):
        budget.observe_drafter(0, 0.002)
        budget.observe_drafter(3, 0.002 + 3 * 0.010)
    assert budget.cost.drafter_pass_s == pytest.approx(0.010, rel=1e-6)
    price = budget.pass_price(4)
    assert price > 0
    # Three passes for one request gaining half a token: not worth it; for many, it is.
    assert not passes_pay([0.5], 3, price)
    assert passes_pay([0.5] * 64, 3, price)
    assert passes_pay([], 0, price)  # no pass beyond the first: nothing to pay


def test_a_model_draft_is_as_long_as_its_tokens_pay() -> None:
    rule = HybridRule(estimate=ModelDrafterEstimate(prior=0.8, prior_weight=1e6))
    assert rule.paying_length(4, 0.0) == 4
    assert rule.paying_length(4, 0.7) == 1  # 0.8 pays, 0.64 does not
    assert rule.paying_length(4, 0.9) == 0
    assert net_tokens(2.0, 4, 0.25) == pytest.approx(1.0)


def test_ranks_that_do_not_learn_from_their_clocks_decide_alike() -> None:
    ranks = [CostBudget(K, CPU, learns=False), CostBudget(K, CPU, learns=False)]
    learners = [CostBudget(K, CPU), CostBudget(K, CPU)]
    clocks = (1.0, 37.0)  # rank 1's clock runs 37 times slower
    decided: list[list[tuple[int, float]]] = [[], [], [], []]
    rng = random.Random(2)
    for _ in range(200):
        batch = rng.randint(1, 8)
        verified, emitted = batch * rng.randint(1, K + 1), batch * rng.randint(1, 4)
        for n, budget in enumerate(ranks + learners):
            seconds = CPU.step_seconds(batch, verified) * clocks[n % 2]
            budget.observe_timed_step(batch, verified, emitted, seconds)
            budget.observe_step(batch, 100.0, 1e-4 * clocks[n % 2], True)
            decided[n].append((budget.tokens_for(batch), budget.min_prob_for(batch)))
    assert decided[0] == decided[1]
    assert decided[2] != decided[3]  # the check can fail: learning ranks part ways


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        CostBudget(-1)
    with pytest.raises(ValueError, match="explore_every"):
        CostBudget(K, explore_every=-1)
