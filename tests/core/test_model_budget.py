"""Draft caps from the speed model (agentspec.draft_budget.speed_budget): warm-up and exploration at full
length, only full-length drafts teach, the chosen cap is the model's fastest, and the
driver feeds it what its drafts did."""

from __future__ import annotations

import pytest

from agentspec.draft_budget.speed_budget import SpeedBudget
from agentspec.draft_budget.speed_model import DraftOutcomes, parse_speed_model
from agentspec.driver import RequestDriver, RequestSpec
from agentspec.index import DraftIndex
from agentspec.index.policy import IndexConfig

H100_8B = parse_speed_model("h100:8b")
K = 16


def _budget(accepted: int, drafts: int = 400, **kwargs: int) -> SpeedBudget:
    """A budget that has seen ``drafts`` full-length drafts of K tokens, ``accepted`` kept each."""
    budget = SpeedBudget(H100_8B, K, **kwargs)
    for _ in range(drafts):
        budget.observe_draft(K, K, accepted)
    budget.observe_step(64, 4000.0, 20e-6, True)
    budget.observe_step(64, 4000.0, 5e-6, False)
    return budget


def _choices(budget: SpeedBudget, batch: int, steps: int) -> list[int]:
    return [budget.tokens_for(batch) for _ in range(steps)]


def test_full_length_until_it_has_seen_enough_drafts() -> None:
    budget = _budget(accepted=0, drafts=10, warmup=100)
    assert _choices(budget, 128, 20) == [K] * 20
    for _ in range(90):
        budget.observe_draft(K, K, 0)
    assert budget.tokens_for(128) == 0  # nothing is ever accepted: drafting only costs


def test_drafts_that_pay_are_kept_and_drafts_that_do_not_are_dropped() -> None:
    assert _budget(accepted=K).best_cap(128) == K
    assert _budget(accepted=0).best_cap(128) == 0
    # Half the draft accepted: worth it while the step is memory-bound.
    half = _budget(accepted=K // 2)
    assert half.best_cap(1) >= K // 2


def test_the_cap_is_the_speed_models_fastest() -> None:
    budget = _budget(accepted=5)
    outcomes = DraftOutcomes(counts=dict(budget.outcomes))
    for batch in (1, 8, 32, 128):

        def speed(k: int, batch: int = batch) -> float:
            return H100_8B.batch_tokens_per_second(
                batch,
                4000.0,
                outcomes.emitted(k) if k else 1.0,
                outcomes.verified(k) if k else 1.0,
                budget.drafter_s[k > 0],
            )

        best = budget.best_cap(batch)
        assert all(speed(best) >= speed(k) for k in range(K + 1))


def test_one_step_in_n_explores_at_full_length() -> None:
    budget = _budget(accepted=0, explore_every=4)
    choices = _choices(budget, 128, 12)
    assert choices.count(K) == 3 and choices.count(0) == 9
    assert [i for i, c in enumerate(choices, 1) if c == K] == [4, 8, 12]


def test_the_window_keeps_the_warm_up() -> None:
    with pytest.raises(ValueError, match="window"):
        SpeedBudget(H100_8B, K, warmup=100, window=150)


def test_only_full_length_drafts_teach() -> None:
    budget = SpeedBudget(H100_8B, K)
    budget.observe_draft(4, 4, 4)  # cut to 4 and wholly accepted: says nothing about 16
    assert budget.proposals == 0
    budget.observe_draft(K, 3, 1)
    assert budget.outcomes == {(3, 1): 1}


def test_counts_are_halved_past_the_window_and_caps_refit() -> None:
    budget = _budget(accepted=K, drafts=100, warmup=50, window=150, refit_every=4)
    assert budget.tokens_for(128) == K
    for _ in range(60):
        budget.observe_draft(K, K, 0)
    # The 151st draft halved the counts: 100 kept drafts became 50, 51 refused ones 25.
    assert budget.outcomes == {(K, K): 50, (K, 0): 25 + 9}
    # The traffic changed: drafts are no longer accepted. Within refit_every steps the
    # cached cap is replaced.
    for _ in range(400):
        budget.observe_draft(K, K, 0)
    assert _choices(budget, 128, 8)[-1] == budget.best_cap(128) < K // 2


def test_context_and_drafter_time_are_running_means() -> None:
    budget = SpeedBudget(H100_8B, K)
    budget.observe_step(4, 1000.0, 10e-6, True)
    assert budget.context_tokens == 1000.0 and budget.drafter_s[True] == 10e-6
    for _ in range(200):
        budget.observe_step(4, 3000.0, 30e-6, True)
    assert budget.context_tokens == pytest.approx(3000.0, rel=1e-3)
    assert budget.drafter_s[True] == pytest.approx(30e-6, rel=1e-3) and budget.drafter_s[False] == 0.0
    budget.observe_step(0, 9e9, 1.0, True)  # an empty step changes nothing
    assert budget.context_tokens == pytest.approx(3000.0, rel=1e-3)


def test_the_driver_tells_the_budget_what_each_draft_did() -> None:
    budget = SpeedBudget(H100_8B, 8)
    driver = RequestDriver(DraftIndex(IndexConfig(global_max_tokens=0)), budget)
    prompt, output = list(range(1, 30)), list(range(100, 140))
    driver.admit("a", RequestSpec("s", None))
    driver.begin("a", prompt + output)
    driver.advance("a", output[:2])
    driver.release("a")
    driver.admit("b", RequestSpec("s", None))
    driver.begin("b", [999, *prompt])
    driver.advance("b", output[:3])
    cap = driver.budget_for(1, 8)
    assert cap == 8  # warming up
    draft = driver.draft("b", cap)
    assert draft is not None and len(draft.token_ids) == 8
    driver.verified("b", 5)
    assert budget.outcomes == {(8, 5): 1}
    driver.advance("b", output[3:9])
    assert driver.draft("b", 4) is not None
    driver.verified("b", 4)  # a cut draft: not counted
    assert budget.outcomes == {(8, 5): 1}
    driver.admit("c", RequestSpec("other", None))
    driver.begin("c", [5000, 5001])
    driver.advance("c", [5002])
    empty = driver.draft("c", 8)
    assert empty is not None and not empty.token_ids
    assert budget.outcomes == {(8, 5): 1, (0, 0): 1}  # nothing matched: counted at once


# --- probability cuts -------------------------------------------------------------------


def test_each_cut_counts_what_it_would_have_kept() -> None:
    budget = SpeedBudget(H100_8B, K)
    budget.observe_draft(K, 3, 2, [0.9, 0.5, 0.35])
    assert budget.outcomes_by_cut[0.0] == {(3, 2): 1} and budget.outcomes == {(3, 2): 1}
    assert budget.outcomes_by_cut[0.3] == {(3, 2): 1}
    assert budget.outcomes_by_cut[0.4] == {(2, 2): 1}
    assert budget.outcomes_by_cut[0.6] == {(1, 1): 1}
    assert budget.outcomes_by_cut[0.8] == {(1, 1): 1}
    # Without probabilities no cut is credited with shortening the draft.
    budget.observe_draft(K, 2, 0)
    assert budget.outcomes_by_cut[0.8] == {(1, 1): 1, (2, 0): 1}
    with pytest.raises(ValueError, match="cut_probs"):
        SpeedBudget(H100_8B, K, cut_probs=(0.3, 0.5))


def _tails(tail_accepted: bool, drafts: int = 400) -> SpeedBudget:
    """Drafts of K tokens whose path probability drops to 0.35 after 12 tokens (half of
    them) or after 2 (the other half); the tail is accepted or never."""
    budget = SpeedBudget(H100_8B, K)
    for i in range(drafts):
        head = 12 if i % 2 else 2
        probs = [0.9] * head + [0.35] * (K - head)
        budget.observe_draft(K, K, K if tail_accepted else head, probs)
    budget.observe_step(128, 4000.0, 20e-6, True)
    budget.observe_step(128, 4000.0, 5e-6, False)
    return budget


def test_a_cut_drops_the_tails_a_cap_cannot_tell_apart() -> None:
    budget = _tails(tail_accepted=False)
    limits = budget.best_limits(128)
    # No cap keeps the long heads without the short heads' tails; the cut at 0.4 does.
    assert limits.min_prob == 0.4 and limits.tokens == 12
    outcomes = DraftOutcomes(counts=dict(budget.outcomes))
    cap_only = max(
        H100_8B.batch_tokens_per_second(128, 4000.0, outcomes.emitted(k), outcomes.verified(k), 20e-6)
        for k in range(1, K + 1)
    )
    assert limits.tokens_per_s > cap_only
    # Tails that are accepted are worth verifying: no cut.
    accepted = _tails(tail_accepted=True).best_limits(128)
    assert (accepted.tokens, accepted.min_prob) == (K, 0.0)


def test_the_limits_are_the_speed_models_fastest_pair() -> None:
    budget = _tails(tail_accepted=False)
    for batch in (1, 8, 64, 128):
        best = budget.best_limits(batch)
        for cut, counts in budget.outcomes_by_cut.items():
            outcomes = DraftOutcomes(counts=dict(counts))
            for k in range(K + 1):
                speed = H100_8B.batch_tokens_per_second(
                    batch,
                    4000.0,
                    outcomes.emitted(k) if k else 1.0,
                    outcomes.verified(k) if k else 1.0,
                    budget.drafter_s[k > 0],
                )
                assert best.tokens_per_s >= speed, (batch, cut, k)


def test_the_driver_cuts_the_steps_drafts_and_they_do_not_teach() -> None:
    budget = _tails(tail_accepted=False, drafts=300)  # past the warm-up
    index = DraftIndex(IndexConfig(global_max_tokens=0))
    driver = RequestDriver(index, budget)
    prompt, output = list(range(1, 30)), list(range(100, 140))
    driver.admit("a", RequestSpec("s", None))
    driver.begin("a", prompt + output)
    driver.release("a")
    driver.admit("b", RequestSpec("s", None))
    driver.begin("b", [999, *prompt])
    driver.advance("b", output[:1])
    before = {cut: dict(counts) for cut, counts in budget.outcomes_by_cut.items()}
    cap = driver.budget_for(128, K)
    assert (cap, driver.min_prob) == (12, 0.4) and driver.counters["draft_min_prob"] == 0.4
    draft = driver.draft("b", cap)
    assert draft is not None and draft.token_ids and all(p >= 0.4 for p in draft.probs)
    driver.verified("b", len(draft.token_ids))
    assert {cut: dict(counts) for cut, counts in budget.outcomes_by_cut.items()} == before
    # A step with no budget cut: the full draft teaches again.
    driver.min_prob = 0.0
    driver.advance("b", output[1 : 2 + len(draft.token_ids)])
    full = driver.draft("b", K)
    assert full is not None
    driver.verified("b", 0)
    assert sum(budget.outcomes.values()) == sum(before[0.0].values()) + 1
