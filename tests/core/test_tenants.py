"""Tenants in the draft index: a tenant drafts only from its own text, at every level."""

from __future__ import annotations

from agentspec.index import DraftIndex, Level
from agentspec.index.policy import IndexConfig

SECRET = list(range(500, 540))
PROMPT = [1, 2, 3, 4, 5]


def _run_call(index: DraftIndex, call_id: str, tokens: list[int], **where: str) -> None:
    index.start_call(call_id, PROMPT, **where)
    index.extend_call(call_id, tokens)
    index.finish_call(call_id)


def _draft_after(index: DraftIndex, call_id: str, prefix: list[int], **where: str) -> list[int]:
    index.start_call(call_id, [9, 9] + PROMPT, **where)
    index.extend_call(call_id, prefix)
    draft = index.propose(call_id)
    index.finish_call(call_id)
    return draft.token_ids


def test_the_global_corpus_is_per_tenant() -> None:
    index = DraftIndex()
    _run_call(index, "a1", SECRET, session_id="sa", tenant="A")
    # Another session of A drafts A's output from the global corpus ...
    assert _draft_after(index, "a2", SECRET[:4], session_id="sa2", tenant="A")[:4] == SECRET[4:8]
    # ... B, the default tenant and a session-less call of B get nothing from it.
    assert _draft_after(index, "b1", SECRET[:4], session_id="sb", tenant="B") == []
    assert _draft_after(index, "d1", SECRET[:4], session_id="sd") == []
    assert _draft_after(index, "b2", SECRET[:4], tenant="B") == []


def test_the_same_ids_in_two_tenants_are_two_scopes() -> None:
    index = DraftIndex(IndexConfig(global_max_tokens=0))
    _run_call(index, "a1", SECRET, session_id="s", group_id="g", tenant="A")
    index.seed(SECRET, group_id="g2", tenant="A")
    # B names A's session and groups: it finds none of A's text.
    assert _draft_after(index, "b1", SECRET[:4], session_id="s", tenant="B") == []
    assert _draft_after(index, "b2", SECRET[:4], session_id="t", group_id="g", tenant="B") == []
    assert _draft_after(index, "b3", SECRET[:4], session_id="u", group_id="g2", tenant="B") == []
    assert index.session_stats("s", "B").calls == 1 and index.session_stats("s", "A").calls == 1
    assert index.group_stats("g2", "A").seeded_tokens == len(SECRET)
    assert index.group_stats("g2", "B").seeded_tokens == 0  # B's own g2: its call's output only
    # A itself does draft from its group.
    assert _draft_after(index, "a2", SECRET[:4], session_id="v", group_id="g", tenant="A")[:4] == SECRET[4:8]


def test_peer_outputs_go_to_their_tenant() -> None:
    index = DraftIndex()
    index.add_peer_output(SECRET, tenant="A")
    assert _draft_after(index, "a", SECRET[:4], session_id="sa", tenant="A")[:4] == SECRET[4:8]
    assert _draft_after(index, "b", SECRET[:4], session_id="sb", tenant="B") == []


def test_calibration_is_per_tenant() -> None:
    index = DraftIndex()
    _run_call(index, "a1", SECRET, session_id="sa", tenant="A")
    index.start_call("a2", [7] + PROMPT, session_id="sa2", tenant="A")
    index.extend_call("a2", SECRET[:4])
    draft = index.propose("a2")
    assert draft.level is Level.GLOBAL
    index.record_verification("a2", len(draft.token_ids), 0)  # all rejected
    index.finish_call("a2")
    assert index.level_weights("A")["global"] < 1.0
    assert index.level_weights("B") == {}


def test_accepted_tokens_are_counted_by_level() -> None:
    index = DraftIndex()
    _run_call(index, "a1", SECRET, session_id="sa", tenant="A")
    index.start_call("a2", [7] + PROMPT, session_id="sa2", group_id="ga", tenant="A")
    index.extend_call("a2", SECRET[:4])
    draft = index.propose("a2")
    index.record_verification("a2", len(draft.token_ids), 3)
    assert index.session_stats("sa2", "A").accepted_tokens_by_level == {"global": 3}
    assert index.group_stats("ga", "A").accepted_tokens_by_level == {"global": 3}


def test_the_global_budget_is_shared_and_the_largest_tenant_gives_way() -> None:
    index = DraftIndex(IndexConfig(global_max_tokens=100))
    _run_call(index, "b1", list(range(1000, 1030)), session_id="sb", tenant="B")
    for i in range(3):
        _run_call(index, f"a{i}", list(range(2000 + 100 * i, 2030 + 100 * i)), session_id="sa", tenant="A")
    # 120 tokens of global text for a budget of 100: A, holding the most, loses its oldest.
    assert index.stats().global_tokens <= 100
    assert _draft_after(index, "b2", [1000, 1001, 1002], session_id="sb2", tenant="B")[:3] == [1003, 1004, 1005]
    assert _draft_after(index, "a3", [2000, 2001, 2002], session_id="sa3", tenant="A") == []
