"""The request driver (agentspec.driver) over the real draft index: what the vLLM proposer
and the replay benchmark both run."""

from __future__ import annotations

import numpy as np

from agentspec.draft_budget.batch_budget import BatchBudget
from agentspec.driver import RequestDriver, RequestSpec, TokenSeed
from agentspec.index import DraftIndex, Level
from agentspec.index.policy import IndexConfig
from agentspec.wire import SeedKind, SeedScope

PROMPT = list(range(1, 30))
OUTPUT = list(range(100, 140))
NO_GLOBAL = IndexConfig(global_max_tokens=0)


def _driver(config: IndexConfig = NO_GLOBAL, budget: BatchBudget | None = None) -> RequestDriver:
    return RequestDriver(DraftIndex(config), budget)


def test_a_seed_drafts_the_output_it_holds() -> None:
    d = _driver()
    outcome = d.admit("r", RequestSpec("s", None, seeds=(TokenSeed(tuple(OUTPUT), kind=SeedKind.REPAIR_ATTEMPT),)))
    assert outcome.seeded_tokens == len(OUTPUT) and not outcome.refused
    d.begin("r", PROMPT, OUTPUT[:3])
    draft = d.draft("r")
    assert draft is not None and draft.token_ids[:5] == OUTPUT[3:8]
    assert draft.level is Level.SESSION
    assert d.counters["seeded_tokens_total"] == len(OUTPUT) and d.counters["calls_started_total"] == 1


def test_group_seed_without_a_group_goes_to_the_session() -> None:
    d = _driver()
    d.admit("r", RequestSpec("s", None, seeds=(TokenSeed((7, 8, 9), scope=SeedScope.GROUP),)))
    stats = d.index.session_stats("s")
    assert stats is not None and stats.seeded_tokens == 3
    d.admit("q", RequestSpec("t", "g", seeds=(TokenSeed((7, 8, 9), scope=SeedScope.GROUP),)))
    assert d.index.session_stats("t") is None  # it went to group g, not to session t


def test_refused_seeds_are_reported_and_counted() -> None:
    d = _driver(NO_GLOBAL.model_copy(update={"seed_max_tokens": 4}))
    outcome = d.admit("r", RequestSpec("s", None, seeds=(TokenSeed(tuple(range(10))), TokenSeed((1, 2)))))
    assert outcome.seeded_tokens == 2
    assert len(outcome.refused) == 1 and "seed_max_tokens" in outcome.refused[0][1]
    assert d.counters["seed_errors_total"] == 1


def test_a_seed_only_request_seeds_but_is_neither_indexed_nor_drafted() -> None:
    d = _driver()
    d.admit("carrier", RequestSpec("s", None, seeds=(TokenSeed(tuple(OUTPUT)),), seed_only=True))
    assert d.begin("carrier", [OUTPUT[0]]) is None
    d.advance("carrier", [5])
    assert d.draft("carrier") is None
    assert not d.index.has_call("carrier")
    stats = d.index.session_stats("s")
    assert stats is not None and (stats.calls, stats.seeded_tokens, stats.indexed_tokens) == (0, len(OUTPUT), 0)
    assert d.counters["seed_only_requests_total"] == 1 and "calls_started_total" not in d.counters
    assert d.release("carrier") is None and "calls_finished_total" not in d.counters


def test_output_is_clipped_at_the_stop_and_at_max_tokens() -> None:
    d = _driver(IndexConfig())  # with the global corpus: outputs are shareable
    d.admit("r", RequestSpec("s", None, stop_ids=frozenset({OUTPUT[4]})))
    d.begin("r", PROMPT)
    d.advance("r", OUTPUT[:8])  # the step emitted past the stop: the scheduler drops the rest
    assert d.draft("r") is None  # done: no more drafts
    out = d.release("r", share=True)
    assert out is not None and list(out) == OUTPUT[:5]

    d.admit("m", RequestSpec("s2", None, max_tokens=3))
    d.begin("m", PROMPT, OUTPUT[:2])
    d.advance("m", OUTPUT[2:6])
    assert list(d.release("m", share=True)) == OUTPUT[:3]


def test_verification_is_recorded_against_the_last_draft() -> None:
    d = _driver()
    d.admit("a", RequestSpec("s", None))
    d.begin("a", PROMPT + OUTPUT)
    d.advance("a", OUTPUT[:2])
    d.release("a")
    d.admit("b", RequestSpec("s", None))
    d.begin("b", [999] + PROMPT)
    d.advance("b", OUTPUT[:3])
    draft = d.draft("b", 6)
    assert draft is not None and len(draft.token_ids) == 6 == d.last_draft_len("b")
    d.verified("b", 50)  # more than drafted: clamped
    stats = d.index.session_stats("s")
    assert stats is not None and (stats.drafted_tokens, stats.accepted_tokens) == (6, 6)
    assert d.draft("b", 0) is None and d.last_draft_len("b") == 0
    d.verified("b", 3)  # no draft outstanding: nothing recorded
    assert d.index.session_stats("s").drafted_tokens == 6


def test_batch_budget_shrinks_and_counts() -> None:
    d = _driver(budget=BatchBudget(8, full_batch=2, off_batch=4))
    assert d.budget_for(1, 8) == 8 and "budget_limited_steps_total" not in d.counters
    assert d.budget_for(3, 8) == 4 and d.counters["budget_limited_steps_total"] == 1
    assert d.budget_for(5, 8) == 0 and d.counters["budget_off_steps_total"] == 1
    assert d.counters["batch_size"] == 5 and d.counters["draft_budget"] == 0
    assert _driver().budget_for(100, 8) == 8  # no budget: vLLM's own k


def test_disable_finishes_the_call_and_stops_drafting() -> None:
    d = _driver()
    d.admit("r", RequestSpec("s", None))
    d.begin("r", np.asarray(PROMPT + PROMPT[:5], dtype=np.int32))
    d.disable("r")
    assert not d.index.has_call("r")
    assert d.draft("r") is None
    d.advance("r", [1, 2])  # ignored, not an error


def test_recent_sessions_forget_what_the_index_evicted() -> None:
    d = _driver(NO_GLOBAL.model_copy(update={"max_sessions": 2}))
    for i in range(3):
        d.admit(f"r{i}", RequestSpec(f"s{i}", None))
        d.begin(f"r{i}", PROMPT)
        d.release(f"r{i}")
    assert list(d.recent_sessions()) == [("", "s1"), ("", "s2")]


def _sibling(d: RequestDriver, req: str, session: str, output: list[int] = OUTPUT) -> None:
    d.admit(req, RequestSpec(session, "grp"))
    d.begin(req, PROMPT)
    d.advance(req, output)
    d.release(req)


def _draft_level(d: RequestDriver, req: str, session: str) -> Level | None:
    d.admit(req, RequestSpec(session, "grp"))
    d.begin(req, PROMPT, OUTPUT[:3])
    draft = d.draft(req)
    level = draft.level if draft is not None and draft.token_ids else None
    d.release(req)
    return level


def test_a_new_policy_retires_group_and_global_outputs_but_not_seeds_or_sessions() -> None:
    d = _driver(IndexConfig())
    d.admit(
        "seeder", RequestSpec("s0", "grp", seeds=(TokenSeed((7, 8, 9, 10), scope=SeedScope.GROUP),), seed_only=True)
    )
    d.release("seeder")
    _sibling(d, "a", "s1")
    assert _draft_level(d, "b", "s2") in (Level.GROUP, Level.GLOBAL)  # a sibling's output drafts
    held = d.index.stats()
    retired = d.set_policy_version(1)
    assert retired > 0 and d.counters["retired_output_tokens_total"] == retired and d.policy_version == 1
    after = d.index.stats()
    assert after.global_tokens == 0 and after.group_tokens == 4  # the group's seed stays
    assert after.session_tokens == held.session_tokens  # sessions keep their own text
    assert _draft_level(d, "c", "s3") is None  # nothing left to draft the old output from
    assert _draft_level(d, "d", "s1") in (Level.CALL, Level.SESSION)  # its own session still drafts it


def test_policy_versions_move_forward_and_can_keep_old_outputs() -> None:
    d = _driver(IndexConfig())
    _sibling(d, "a", "s1")
    assert d.set_policy_version(2, keep_old_outputs=True) == 0
    assert _draft_level(d, "b", "s2") in (Level.GROUP, Level.GLOBAL)
    assert d.set_policy_version(1) == 0 and d.set_policy_version(2) == 0  # older or equal: nothing
    assert d.policy_version == 2 and d.counters["policy_updates_total"] == 1


def test_a_call_in_flight_at_an_update_stops_feeding_the_group() -> None:
    d = _driver(IndexConfig())
    d.admit("old", RequestSpec("s1", "grp"))
    d.begin("old", PROMPT)
    d.advance("old", OUTPUT[:20])
    d.set_policy_version(1)
    d.advance("old", OUTPUT[20:])  # generated under the old policy after the update
    d.release("old")
    assert d.index.stats().group_tokens == 0 and d.index.stats().global_tokens == 0
    assert _draft_level(d, "new", "s2") is None


def test_a_policy_request_is_applied_at_admission_and_never_drafted() -> None:
    d = _driver(IndexConfig())
    _sibling(d, "a", "s1")
    d.admit("ctl", RequestSpec(policy_version=3, seed_only=True))
    assert d.begin("ctl", [0]) is None and d.policy_version == 3
    d.release("ctl")
    assert d.index.stats().group_tokens == 0


def test_session_statistics_split_drafts_by_the_version_a_call_arrived_under() -> None:
    d = _driver(IndexConfig())
    d.set_policy_version(1)

    def turn(req_id: str, prompt: list[int]) -> None:
        d.admit(req_id, RequestSpec("s1", "grp"))
        d.begin(req_id, prompt)
        draft = d.draft(req_id)
        assert draft is not None and draft.token_ids
        d.verified(req_id, 2)  # the model accepted two of the draft's tokens
        d.advance(req_id, draft.token_ids[:2] + [999])

    turn("t1", PROMPT + PROMPT[:3])  # the prompt repeats itself: the call drafts
    d.admit("t2", RequestSpec("s1", "grp"))  # arrives under version 1 ...
    d.set_policy_version(2)  # ... and begins after the update: it stays a version-1 call
    d.begin("t2", PROMPT + PROMPT[:3])
    assert d.draft("t2") is not None
    d.verified("t2", 1)
    turn("t3", PROMPT + PROMPT[:3] + [5])
    stats = d.index.session_stats("s1")
    assert stats is not None and stats.policy_version == 2
    assert stats.accepted_tokens_by_policy_version == {"1": 3, "2": 2}
    assert sum(stats.drafted_tokens_by_policy_version.values()) == stats.drafted_tokens
    group = d.index.group_stats("grp")
    assert group is not None and group.accepted_tokens_by_policy_version == {"1": 3, "2": 2}


def test_without_announced_versions_sessions_have_no_version_statistics() -> None:
    d = _driver()
    d.admit("a", RequestSpec("s1"))
    d.begin("a", PROMPT + PROMPT[:3])
    assert d.draft("a") is not None
    d.verified("a", 1)
    stats = d.index.session_stats("s1")
    assert stats is not None and stats.policy_version is None and stats.accepted_tokens == 1
    assert stats.drafted_tokens_by_policy_version == {} == stats.accepted_tokens_by_policy_version


def test_accepted_tokens_past_the_requests_end_are_not_credited() -> None:
    d = _driver()
    d.admit("a", RequestSpec("s", None))
    d.begin("a", PROMPT + OUTPUT)
    d.advance("a", OUTPUT[:2])
    d.release("a")
    # max_tokens 6: one token came with prefill, so the step can deliver 5 more.
    d.admit("b", RequestSpec("s", None, max_tokens=6, stop_ids=frozenset({OUTPUT[7]})))
    d.begin("b", [999, *PROMPT], OUTPUT[:1])
    draft = d.draft("b", 8)
    assert draft is not None and len(draft.token_ids) == 8
    # The engine accepted all 8 and sampled a bonus; the request keeps 5 of the 9.
    d.verified("b", 8, OUTPUT[1:10])
    stats = d.index.session_stats("s")
    assert stats is not None and (stats.drafted_tokens, stats.accepted_tokens) == (8, 5)
    assert d.distributions["accepted_tokens_per_draft"] == {5: 1}


def test_a_stop_inside_the_accepted_draft_ends_the_credit() -> None:
    d = _driver()
    d.admit("a", RequestSpec("s", None))
    d.begin("a", PROMPT + OUTPUT)
    d.advance("a", OUTPUT[:2])
    d.release("a")
    d.admit("b", RequestSpec("s", None, stop_ids=frozenset({OUTPUT[3]})))
    d.begin("b", [999, *PROMPT], OUTPUT[:1])
    assert d.draft("b", 6) is not None
    d.verified("b", 6, OUTPUT[1:8])  # the stop is the 3rd emitted token: 3 kept
    assert d.index.session_stats("s").accepted_tokens == 3


def test_a_withdrawn_draft_counts_as_neither_proposed_nor_verified() -> None:
    """The hybrid computes the index's draft, then sends the model drafter's instead."""
    d = _driver()
    d.admit("a", RequestSpec("s", None))
    d.begin("a", PROMPT + OUTPUT)
    d.advance("a", OUTPUT[:2])
    draft = d.draft("a", 6)
    assert draft is not None and (n := len(draft.token_ids)) > 0
    before = d.index.stats()
    assert before.drafts_by_level[draft.level.value] == 1 and d.distributions["draft_length"][n] == 1
    d.withdraw("a")
    after = d.index.stats()
    assert after.drafts_by_level[draft.level.value] == 0 and after.drafted_tokens_by_level[draft.level.value] == 0
    assert n not in d.distributions["draft_length"] and d.last_draft_len("a") == 0
    d.verified("a", 4)  # the verification of the model's draft is not the index's
    stats = d.index.session_stats("s")
    assert stats is not None and stats.drafted_tokens == 0 and after.accepted_tokens_by_level[draft.level.value] == 0
    assert d.may_draft("a")


def test_model_drafts_are_counted_apart_in_session_and_group_stats() -> None:
    d = _driver()
    d.admit("a", RequestSpec("s", "g"))
    d.begin("a", PROMPT)
    d.index.record_model_verification("a", 4, 3)
    d.index.record_model_verification("a", 4, 0)
    for stats in (d.index.session_stats("s"), d.index.group_stats("g")):
        assert stats is not None
        assert (stats.model_draft_steps, stats.model_drafted_tokens, stats.model_accepted_tokens) == (2, 8, 3)
        assert (stats.draft_steps, stats.drafted_tokens) == (0, 0)  # the index's own stay apart
