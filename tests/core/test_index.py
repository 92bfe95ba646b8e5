"""Behaviour of the session draft index (agentspec.index) over arctic's native suffix tree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentspec import (
    Draft,
    DraftIndex,
    DraftIndexError,
    DraftPolicy,
    IndexConfig,
    Level,
    SeedKind,
    SeedLimitError,
    UnknownCallError,
)

NO_GLOBAL = IndexConfig(global_max_tokens=0)


def contains(haystack: list[int], needle: list[int]) -> bool:
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


# ---------------------------------------------------------------- drafting basics


def test_agent_turn_drafts_repeated_text_from_the_call_level():
    index = DraftIndex()
    index.start_call("t1", [5, 6, 7, 8, 9, 10, 11], session_id="s")
    draft = index.propose("t1")
    assert draft == Draft.empty()  # nothing repeats yet
    index.extend_call("t1", [5, 6, 7])
    draft = index.propose("t1")
    assert draft.token_ids[:4] == [8, 9, 10, 11]
    assert draft.level is Level.CALL
    assert draft.match_len == 3


def test_budget_caps_the_draft_and_zero_switches_drafting_off():
    index = DraftIndex()
    index.start_call("c", list(range(1, 40)) + [1, 2, 3], session_id="s")
    assert len(index.propose("c").token_ids) > 4
    assert len(index.propose("c", max_tokens=4).token_ids) == 4
    assert index.propose("c", max_tokens=0).token_ids == []


def test_a_probability_cut_keeps_the_drafts_likely_prefix_and_counts_what_was_drafted():
    index = DraftIndex()
    # After [1, 2, 3, 4]: 5 in two of three seeds, then 6 in one of those two.
    for seed in ([1, 2, 3, 4, 5, 6, 60, 61], [1, 2, 3, 4, 7, 8, 70, 71], [1, 2, 3, 4, 5, 9, 90, 91]):
        index.seed(seed, session_id="s")
    index.start_call("c", [50, 1, 2, 3, 4], session_id="s")
    full = index.propose("c")
    assert full.token_ids == [5, 6, 60, 61] and full.probs[0] == pytest.approx(2 / 3)
    drafted = index.stats().drafted_tokens_by_level[Level.SESSION.value]
    cut = index.propose("c", min_prob=0.5)
    assert (cut.token_ids, cut.score) == ([5], pytest.approx(2 / 3))
    assert index.stats().drafted_tokens_by_level[Level.SESSION.value] == drafted + 1
    assert index.propose("c", min_prob=0.1).token_ids == full.token_ids  # below the policy's own: no cut
    nothing = index.propose("c", min_prob=0.9)
    assert nothing.token_ids == [] and nothing.level is Level.NONE


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(
        st.tuples(
            st.lists(st.integers(0, 5), min_size=0, max_size=30),  # new user/tool text
            st.lists(st.integers(0, 5), min_size=1, max_size=20),  # model output
        ),
        min_size=1,
        max_size=5,
    ),
    seed=st.lists(st.integers(0, 5), max_size=20),
)
def test_drafts_only_continue_text_that_was_indexed(turns, seed):
    """Every draft, with the context it matched, is a substring of text the index was given."""
    index = DraftIndex(IndexConfig(policy=DraftPolicy(max_depth=16, max_spec_tokens=8, min_token_prob=0.0)))
    texts: list[list[int]] = []
    if seed:
        index.seed(seed, session_id="s")
        texts.append(seed)
    context: list[int] = []
    for i, (new, output) in enumerate(turns):
        context = context + new
        index.start_call(i, context, session_id="s", group_id="g")
        for tok in output:
            draft = index.propose(i)
            if draft.token_ids:
                matched = context[len(context) - draft.match_len :] if draft.match_len else []
                assert any(contains(t, matched + draft.token_ids) for t in texts + [context]), (
                    draft,
                    context,
                )
            context = context + [tok]
            index.extend_call(i, [tok])
        texts.append(list(context))
        index.finish_call(i)


# ---------------------------------------------------------------- incremental indexing


@settings(max_examples=40, deadline=None)
@given(
    turns=st.lists(
        st.tuples(st.lists(st.integers(0, 7), max_size=25), st.lists(st.integers(0, 7), min_size=1, max_size=15)),
        min_size=1,
        max_size=6,
    ),
    probe=st.lists(st.integers(0, 7), min_size=1, max_size=6),
)
def test_incremental_index_drafts_what_a_from_scratch_index_drafts(turns, probe):
    """Turn N+1's prompt = turn N's prompt + output + new text: indexing only the tail must
    give exactly the drafts of an index built in one go over the same text."""
    incremental = DraftIndex(NO_GLOBAL)
    context: list[int] = []
    for i, (new, output) in enumerate(turns):
        context = context + new
        start = incremental.start_call(i, context, session_id="s")
        if i > 0:
            assert start.new_tokens == len(new)  # only the tail was indexed
            assert start.reused_tokens == len(context) - len(new)
            assert not start.rewritten
        incremental.extend_call(i, output)
        context = context + output
        incremental.finish_call(i)
    last = len(turns)
    incremental.start_call(last, context + probe, session_id="s")

    scratch = DraftIndex(NO_GLOBAL)
    scratch.start_call("x", context + probe, session_id="other")
    assert incremental.propose(last) == scratch.propose("x")


def test_rewritten_history_is_indexed_from_the_divergence_and_old_turns_stay_draftable():
    depth = 8
    index = DraftIndex(IndexConfig(policy=DraftPolicy(max_depth=depth, max_spec_tokens=8), global_max_tokens=0))
    system = list(range(100, 120))
    dropped_turn = [7, 7, 1, 2, 3, 4, 5, 6]
    index.start_call(0, system + dropped_turn, session_id="s")
    index.extend_call(0, [9, 9])
    index.finish_call(0)
    # A condenser replaces the old turn by a summary: the prompt diverges after the system text.
    start = index.start_call(1, system + [50, 51, 52, 7, 7, 1], session_id="s")
    assert start.rewritten
    assert start.reused_tokens == len(system)
    assert start.new_tokens == depth + 6  # the overlap before the divergence, then the new text
    draft = index.propose(1)
    assert draft.token_ids[:3] == [2, 3, 4]  # the dropped turn is still drafted
    index.finish_call(1)


def test_condensed_history_costs_only_the_seams_and_the_new_text():
    """A condenser keeps the system text and the recent turns and drops the middle: the
    recent turns are the end of what the session holds, so only the seam where they now
    start and the new text are indexed, and every part stays draftable."""
    depth = 16
    policy = DraftPolicy(max_depth=depth, max_match_tokens=8, max_spec_tokens=8, min_token_prob=0.0)
    index = DraftIndex(IndexConfig(policy=policy, global_max_tokens=0))
    rng = np.random.default_rng(3)
    system, old_turns, recent, output = (list(rng.integers(1000 * k, 1000 * k + 900, n)) for k, n in
                                         ((1, 40), (2, 300), (3, 200), (4, 30)))  # fmt: skip
    index.start_call(0, system + old_turns + recent, session_id="s")
    index.extend_call(0, output)
    index.finish_call(0)

    observation = list(rng.integers(5000, 5900, 50))
    condensed = system + recent + output + observation
    start = index.start_call(1, condensed, session_id="s")
    assert start.rewritten and start.reused_tokens == len(system)
    # The seam (depth before and after the divergence), then depth of overlap + the observation.
    assert start.new_tokens == 2 * depth + depth + len(observation)

    def drafts_after(context: list[int], call: str = "probe") -> list[int]:
        index.start_call(call, context, session_id="s")
        draft = index.propose(call).token_ids
        index.finish_call(call)
        return draft

    # Across the seam, inside the kept turns, into the new text, and in the dropped turns.
    assert drafts_after(system[-4:] + recent[:4])[:4] == recent[4:8]
    assert drafts_after(recent[100:108])[:4] == recent[108:112]
    assert drafts_after(output[-4:] + observation[:4])[:4] == observation[4:8]
    assert drafts_after(old_turns[50:58])[:4] == old_turns[58:62]
    index.finish_call(1)


def test_history_that_is_not_a_condensed_one_is_indexed_whole_from_the_divergence():
    depth = 16
    index = DraftIndex(IndexConfig(policy=DraftPolicy(max_depth=depth, max_match_tokens=8), global_max_tokens=0))
    first = list(range(1, 401))
    index.start_call(0, first, session_id="s")
    index.finish_call(0)
    # The kept part is not the old stream's end (its last 16 tokens are gone): no shortcut.
    rewritten = first[:50] + first[100:380] + [7] * 10
    start = index.start_call(1, rewritten, session_id="s")
    assert start.rewritten and start.new_tokens == depth + 280 + 10


def test_reused_stream_costs_only_the_new_tail_for_a_long_prompt():
    index = DraftIndex()
    prompt = list(np.random.default_rng(0).integers(0, 50_000, size=15_000))
    assert index.start_call(0, prompt, session_id="s").new_tokens == 15_000
    index.extend_call(0, [1, 2, 3])
    index.finish_call(0)
    start = index.start_call(1, prompt + [1, 2, 3] + [4] * 200, session_id="s")
    assert (start.new_tokens, start.reused_tokens) == (200, 15_003)


def test_concurrent_calls_of_one_session_get_their_own_streams():
    index = DraftIndex(NO_GLOBAL)
    index.start_call("a", [1, 2, 3, 4], session_id="s")
    start = index.start_call("b", [1, 2, 3, 4, 5], session_id="s")
    assert start.rewritten and start.reused_tokens == 4
    index.extend_call("a", [1, 2])
    index.extend_call("b", [9])
    assert index.propose("a").token_ids[:2] == [3, 4]
    index.finish_call("a")
    index.finish_call("b")


# ---------------------------------------------------------------- seeds and levels


def test_session_seed_is_drafted_at_the_session_level():
    index = DraftIndex()
    index.seed([40, 41, 42, 43, 44, 45], session_id="s", kind=SeedKind.REPAIR_ATTEMPT)
    index.start_call("c", [1, 2, 40, 41], session_id="s")
    draft = index.propose("c")
    assert draft.token_ids[:4] == [42, 43, 44, 45]
    assert draft.level is Level.SESSION
    assert index.session_stats("s").seeded_tokens == 6


def test_sibling_outputs_are_drafted_at_the_group_level_and_isolation_hides_them_from_others():
    index = DraftIndex(IndexConfig(isolate_groups=True))
    index.start_call("a", [1], session_id="a", group_id="g")
    index.extend_call("a", [20, 21, 22, 23, 24, 25])
    index.finish_call("a")
    index.start_call("b", [1, 20, 21], session_id="b", group_id="g")
    draft = index.propose("b")
    assert (draft.level, draft.token_ids[:3]) == (Level.GROUP, [22, 23, 24])
    index.finish_call("b")
    # Another tenant's call sees nothing of group g.
    index.start_call("c", [1, 20, 21], session_id="c", group_id="other")
    assert index.propose("c").token_ids[:1] != [22]
    index.finish_call("c")


def test_without_isolation_outputs_reach_every_call_through_the_global_level():
    index = DraftIndex()
    index.start_call("a", [1])
    index.extend_call("a", [20, 21, 22, 23, 24, 25])
    index.finish_call("a")
    index.start_call("b", [2, 20, 21])
    draft = index.propose("b")
    assert (draft.level, draft.token_ids[:3]) == (Level.GLOBAL, [22, 23, 24])


def test_verification_counts_reach_session_group_and_level_stats():
    index = DraftIndex()
    index.seed([7, 8, 9, 10], session_id="s")
    index.start_call("c", [7, 8], session_id="s", group_id="g")
    draft = index.propose("c")
    index.record_verification("c", drafted=len(draft.token_ids), accepted=1)
    stats = index.session_stats("s")
    assert (stats.draft_steps, stats.drafted_tokens, stats.accepted_tokens) == (1, len(draft.token_ids), 1)
    assert index.group_stats("g").accepted_tokens == 1
    assert index.stats().accepted_tokens_by_level["session"] == 1


# ---------------------------------------------------------------- memory and lifecycle


def test_eviction_keeps_every_level_within_budget_and_leaves_no_state():
    cfg = IndexConfig(global_max_tokens=2_000, sessions_max_tokens=5_000, session_max_tokens=1_500, max_sessions=20)
    index = DraftIndex(cfg)
    rng = np.random.default_rng(1)
    for s in range(200):
        sid = f"s{s}"
        index.seed(rng.integers(0, 1000, size=100), session_id=sid)
        for turn in range(3):
            call = (sid, turn)
            index.start_call(call, rng.integers(0, 1000, size=300 * (turn + 1)), session_id=sid, group_id=f"g{s % 7}")
            index.extend_call(call, rng.integers(0, 1000, size=50))
            index.finish_call(call)
            global_tokens = index.stats().global_tokens
            assert global_tokens <= cfg.global_max_tokens
            assert index.held_tokens - global_tokens <= cfg.sessions_max_tokens
        stats = index.stats()
        assert stats.sessions + stats.groups <= cfg.max_sessions
    stats = index.stats()
    assert stats.evicted_sessions > 0 and stats.evicted_tokens > 0
    assert index.session_stats("s0") is None  # long evicted
    assert stats.active_calls == 0


def test_a_call_without_session_leaves_nothing_behind_but_its_global_output():
    index = DraftIndex()
    index.start_call("c", list(range(1000)))
    index.extend_call("c", [1, 2, 3])
    index.finish_call("c")
    stats = index.stats()
    assert (stats.sessions, stats.session_tokens, stats.active_calls) == (0, 0, 0)
    assert stats.global_tokens == 3


def test_active_sessions_are_not_evicted():
    index = DraftIndex(IndexConfig(sessions_max_tokens=100, session_max_tokens=100, max_sessions=2))
    index.start_call("a", list(range(90)), session_id="a")
    index.start_call("b", list(range(90)), session_id="b")
    index.start_call("c", list(range(90)), session_id="c")  # all busy: over budget, nothing lost
    for c in "abc":
        assert index.session_stats(c) is not None
        index.finish_call(c)
    index.start_call("d", [1], session_id="d")
    assert index.stats().sessions <= 2


def test_an_idle_session_drops_its_prompts_keeps_its_seeds_and_redrafts_from_its_next_prompt():
    index = DraftIndex(IndexConfig(session_idle_calls=3))
    history = list(range(100, 160))
    index.seed([1, 2, 3, 4, 5, 6, 1, 2], session_id="old")
    index.start_call("o1", history, session_id="old")
    index.extend_call("o1", [7, 7, 7])
    index.finish_call("o1")
    held = index.session_stats("old").held_tokens
    assert held >= len(history) + 3 + 8
    for i in range(3):  # three other calls: "old" is idle for 3 calls, not more
        index.start_call(f"x{i}", [9000 + i], session_id=f"busy{i}")
        index.finish_call(f"x{i}")
    assert index.session_stats("old").held_tokens == held
    index.start_call("x3", [9999], session_id="busy3")  # the fourth: "old" is compacted
    stats = index.session_stats("old")
    assert stats.held_tokens == 8 and stats.seeded_tokens == 8 and stats.calls == 1
    assert index.stats().evicted_tokens == held - 8
    # Its seeds still draft, and its next prompt (its whole context) is indexed again.
    index.start_call("o2", [*history, 7, 7, 7, 1, 2], session_id="old")
    assert index.propose("o2").token_ids[:2] == [3, 4]
    index.finish_call("o2")
    index.start_call("o3", [*history[:20]], session_id="old")
    assert index.propose("o3").token_ids[:4] == history[20:24]


def test_a_session_with_a_call_in_flight_is_never_compacted_and_none_turns_compaction_off():
    for idle in (1, None):
        index = DraftIndex(IndexConfig(session_idle_calls=idle))
        index.start_call("long", list(range(50)), session_id="busy")
        index.start_call("done", list(range(200, 250)), session_id="idle")
        index.finish_call("done")
        for i in range(5):
            index.start_call(f"x{i}", [1000 + i])
            index.finish_call(f"x{i}")
        assert index.session_stats("busy").held_tokens == 50
        assert index.session_stats("idle").held_tokens == (50 if idle is None else 0)


def test_an_idle_group_drops_outputs_the_global_corpus_holds_and_drafts_them_from_there():
    sample = list(range(300, 340))
    index = DraftIndex(IndexConfig(group_idle_calls=2, session_idle_calls=None))
    index.seed([1, 2, 3, 4, 5, 6, 1, 2], group_id="g")
    index.start_call("s1", [7, 8], group_id="g")
    index.extend_call("s1", sample)
    index.start_call("busy", [9, 9], group_id="h")  # in flight all along: never compacted
    index.extend_call("busy", sample[:10])
    index.finish_call("s1")
    held = index.group_stats("g").held_tokens
    assert held == len(sample) + 8
    for i in range(3):
        index.start_call(f"x{i}", [9000 + i])
        index.finish_call(f"x{i}")
    stats = index.group_stats("g")
    assert stats.held_tokens == 8 and stats.seeded_tokens == 8
    assert index.group_stats("h").held_tokens == 10
    # The samples are still drafted, now from the global corpus; the seeds from the group.
    index.start_call("s2", [7, 8, *sample[:6]], group_id="g")
    draft = index.propose("s2")
    assert draft.level is Level.GLOBAL and draft.token_ids[:4] == sample[6:10]
    index.finish_call("s2")
    index.start_call("s3", [1, 2], group_id="g")
    assert index.propose("s3").token_ids[:2] == [3, 4]


@pytest.mark.parametrize("config", [IndexConfig(isolate_groups=True), NO_GLOBAL, IndexConfig(group_idle_calls=None)])
def test_a_group_keeps_its_outputs_where_nothing_else_holds_them_or_compaction_is_off(config):
    index = DraftIndex(config.model_copy(update={"group_idle_calls": config.group_idle_calls and 1}))
    index.start_call("s1", [7, 8], group_id="g")
    index.extend_call("s1", list(range(300, 340)))
    index.finish_call("s1")
    for i in range(3):
        index.start_call(f"x{i}", [9000 + i])
        index.finish_call(f"x{i}")
    assert index.group_stats("g").held_tokens == 40


def test_session_less_calls_never_push_sessions_out():
    index = DraftIndex(IndexConfig(max_sessions=2))
    index.start_call("a", [1, 2, 3], session_id="a")
    index.finish_call("a")
    index.start_call("b", [4, 5, 6], session_id="b")
    index.finish_call("b")
    # Many concurrent calls without a session: each has its own scope while it runs.
    for i in range(5):
        index.start_call(f"anon{i}", [7, 8, 9, i])
    assert index.stats().sessions == 2
    assert index.session_stats("a") is not None and index.session_stats("b") is not None
    for i in range(5):
        index.finish_call(f"anon{i}")
    stats = index.stats()
    assert (stats.sessions, stats.evicted_sessions, stats.active_calls) == (2, 0, 0)
    assert stats.session_tokens == 6  # the anonymous calls' prompts left with their calls


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([1, -2, 3], "non-negative"),
        ([1.5, 2.0], "integers"),
        (["a", "b"], "integers"),
        ("abc", "sequence of integers"),
        ([[1, 2], [3, 4]], "one-dimensional"),
        ([True, False], "integers"),
        ([2**40], "int32"),
        (np.array([1.0, 2.0]), "integers"),
    ],
)
def test_bad_prompts_are_refused_and_the_index_stays_usable(prompt, message):
    index = DraftIndex()
    with pytest.raises(DraftIndexError, match=message):
        index.start_call("c", prompt, session_id="s")
    assert not index.has_call("c")
    index.start_call("c", [1, 2, 3, 1, 2], session_id="s")
    assert index.propose("c").token_ids[:1] == [3]


def test_call_lifecycle_errors():
    index = DraftIndex()
    with pytest.raises(UnknownCallError, match="not active"):
        index.propose("nope")
    with pytest.raises(UnknownCallError):
        index.extend_call("nope", [1])
    index.start_call("c", [1])
    with pytest.raises(DraftIndexError, match="already active"):
        index.start_call("c", [1])
    with pytest.raises(DraftIndexError, match="accepted"):
        index.record_verification("c", drafted=1, accepted=2)
    index.finish_call("c")
    with pytest.raises(UnknownCallError, match="already finished"):
        index.finish_call("c")
    with pytest.raises(DraftIndexError, match="session_id"):
        index.start_call("d", [1], session_id="")
    with pytest.raises(DraftIndexError, match="hashable"):
        index.start_call(["unhashable"], [1])
    index.start_call("d", [1], session_id="s")  # still usable
    index.finish_call("d")


def test_seed_limits_and_bad_seeds():
    index = DraftIndex(IndexConfig(seed_max_tokens=10, seed_max_total_tokens=15))
    assert index.seed(list(range(10)), session_id="s") == 10
    with pytest.raises(SeedLimitError, match="seed_max_tokens=10"):
        index.seed(list(range(11)), session_id="s")
    with pytest.raises(SeedLimitError, match="seed_max_total_tokens=15"):
        index.seed(list(range(6)), session_id="s")
    with pytest.raises(DraftIndexError, match="exactly one"):
        index.seed([1], session_id="s", group_id="g")
    with pytest.raises(DraftIndexError, match="unknown seed kind"):
        index.seed([1], session_id="s", kind="gossip")
    with pytest.raises(DraftIndexError, match="non-negative"):
        index.seed([-1], group_id="g")
    assert index.seed([1, 2, 3], group_id="g") == 3
    assert index.session_stats("s").seeded_tokens == 10


def test_config_validation_names_the_problem():
    with pytest.raises(ValueError, match="session_max_tokens"):
        IndexConfig(sessions_max_tokens=10, session_max_tokens=20)
    with pytest.raises(ValueError, match="max_depth"):
        DraftPolicy(max_depth=0)


# ---------------------------------------------------------------- replicas exchanging outputs


def test_shared_output_is_the_calls_output_unless_isolation_keeps_it_in_its_group():
    index = DraftIndex(IndexConfig(isolate_groups=True))
    index.start_call("free", [1, 2, 3], session_id="s")
    index.extend_call("free", [7, 8])
    index.extend_call("free", [9])
    assert index.shared_output("free").tolist() == [7, 8, 9]
    index.finish_call("free")
    index.start_call("tenant", [1, 2, 3, 7, 8, 9, 4], session_id="s", group_id="g")
    index.extend_call("tenant", [5, 6])
    assert index.shared_output("tenant") is None  # group text never leaves the group
    index.finish_call("tenant")
    with pytest.raises(UnknownCallError):
        index.shared_output("tenant")


def test_peer_outputs_are_drafted_at_the_global_level_within_its_budget():
    index = DraftIndex(IndexConfig(global_max_tokens=50))
    assert index.add_peer_output(list(range(100, 130))) == 30
    index.start_call("c", [5, 100, 101, 102], session_id="s")
    draft = index.propose("c")
    assert (draft.level, draft.token_ids[:3]) == (Level.GLOBAL, [103, 104, 105])
    index.finish_call("c")
    index.add_peer_output(list(range(200, 240)))  # 70 tokens > 50: the oldest output goes
    assert index.stats().global_tokens == 40
    with pytest.raises(DraftIndexError, match="peer output tokens must be non-negative"):
        index.add_peer_output([1, -2])
    assert DraftIndex(NO_GLOBAL).add_peer_output([1, 2, 3]) == 0


def test_level_drafts_lists_every_levels_draft_and_propose_takes_one_of_them():
    index = DraftIndex()
    index.seed([1, 2, 30, 31, 32], session_id="s")
    index.start_call("sib", [7, 7], session_id="other", group_id="g")
    index.extend_call("sib", [1, 2, 40, 41])
    index.finish_call("sib")
    index.start_call("c", [1, 2, 50, 51, 52, 9, 1, 2], session_id="s", group_id="g")
    drafts = index.level_drafts("c")
    by_level = {d.level: d.token_ids for d in drafts}
    assert by_level[Level.CALL][:3] == [50, 51, 52]
    assert by_level[Level.SESSION][:3] == [30, 31, 32]
    assert by_level[Level.GROUP][:2] == by_level[Level.GLOBAL][:2] == [40, 41]
    order = [Level.CALL, Level.SESSION, Level.GROUP, Level.GLOBAL]
    assert [d.level for d in drafts] == sorted(by_level, key=order.index)
    stats_before = index.stats().drafts_by_level
    assert index.propose("c").token_ids in [d.token_ids for d in drafts]
    # level_drafts neither chose nor counted; propose counted once.
    assert sum(index.stats().drafts_by_level.values()) == sum(stats_before.values()) + 1
    long = index.level_drafts("c", DraftPolicy(max_spec_factor=8.0, min_token_prob=0.0))
    assert max(len(d.token_ids) for d in long) >= max(len(d.token_ids) for d in drafts)
