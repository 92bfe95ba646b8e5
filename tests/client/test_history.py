"""The session history kept for re-seeding: budgets, de-duplication, packing into seeds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec.client.history import History, Seed, message_text


def test_message_text_takes_content_parts_and_tool_arguments() -> None:
    msg = {
        "role": "assistant",
        "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}],
        "tool_calls": [{"function": {"name": "run", "arguments": '{"cmd": "ls"}'}}],
    }
    assert message_text(msg) == 'a\nrun\n{"cmd": "ls"}'


def test_chat_turns_record_each_message_once() -> None:
    h = History(10_000, 10_000)
    sys_msg = {"role": "system", "content": "sys"}
    u1 = {"role": "user", "content": "q1"}
    h.add_chat_turn([sys_msg, u1], {"role": "assistant", "content": "a1"})
    # The next prompt repeats the history, including the output sent back.
    h.add_chat_turn(
        [sys_msg, u1, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}],
        {"role": "assistant", "content": "a2"},
    )
    assert [s.text for s in h.entries()] == ["sys\nq1\na1", "q2\na2"]


def test_token_turns_keep_only_the_new_tail() -> None:
    h = History(0, 10_000)
    h.add_token_turn([1, 2, 3], [4, 5])
    h.add_token_turn([1, 2, 3, 4, 5, 6], [7])
    assert [s.token_ids for s in h.entries()] == [(1, 2, 3, 4, 5), (6, 7)]


def test_budgets_evict_oldest_and_trim_to_tail() -> None:
    h = History(max_chars=10, max_tokens=4)
    h.add(Seed(text="aaaaa"))
    h.add(Seed(text="bbbbbbb"))
    assert [s.text for s in h.entries()] == ["bbbbbbb"]
    h.add(Seed(text="0123456789XY"))  # alone over budget: keep its most recent part
    assert [s.text for s in h.entries()] == ["23456789XY"]
    h.add(Seed(token_ids=(1, 2, 3, 4, 5, 6)))
    assert h.entries()[-1].token_ids == (3, 4, 5, 6)
    assert h.chars <= 10 and h.tokens <= 4


@settings(deadline=None)  # a loaded machine must not fail a correctness test
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["prior_turn", "document", "repair_attempt"]),
            st.booleans(),
            st.integers(1, 30),
        ),
        max_size=40,
    ),
    st.integers(1, 16),
)
def test_seeds_fit_the_count_limit_and_stay_in_order(items, limit) -> None:
    h = History(max_chars=300, max_tokens=300)
    for kind, text, n in items:
        h.add(Seed(text="x" * n, kind=kind) if text else Seed(token_ids=tuple(range(n)), kind=kind))
    seeds = h.seeds(limit)
    assert len(seeds) <= limit
    assert sum(s.size for s in seeds) <= h.chars + h.tokens + len(h)  # merges add newlines only
    if len(h) <= limit:
        assert seeds == h.entries()
    else:
        # The newest entry always survives packing.
        newest = h.entries()[-1]
        last = seeds[-1]
        assert last.kind == newest.kind
        if newest.text is not None:
            assert last.text is not None and last.text.endswith(newest.text)
        else:
            assert last.token_ids is not None and last.token_ids[-newest.size :] == newest.token_ids
