"""Choosing among the levels' drafts: the index's chooser hook."""

from __future__ import annotations

from agentspec import DraftIndex, Level
from agentspec.index.choice import Candidate, ChoiceContext, by_calibrated_score
from agentspec.index.corpus import TreeDraft

START = ChoiceContext(position=0, last_drafted=0, last_accepted=0)


def candidate(tokens: list[int], probs: list[float], level: Level = Level.CALL, weight: float = 1.0, match: int = 4):
    return Candidate(TreeDraft(tokens, probs, float(sum(probs)), match), level, weight)


class Recording:
    """Takes the last candidate (the least specific level) and remembers what it was shown."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[Level], ChoiceContext]] = []

    def choose(self, candidates, context):
        self.seen.append(([c.level for c in candidates], context))
        return len(candidates) - 1


class Never:
    def choose(self, candidates, context):
        return -1


def index_with_two_levels(chooser=None) -> DraftIndex:
    """An index where the call level and the global level both draft after [1, 2, 3]."""
    index = DraftIndex(chooser=chooser)
    index.start_call("old", [9, 9], session_id="a")
    index.extend_call("old", [1, 2, 3, 7, 7, 7, 7])
    index.finish_call("old")
    index.start_call("c", [1, 2, 3, 4, 5, 6, 8], session_id="b")
    index.extend_call("c", [1, 2, 3])
    return index


# ---------------------------------------------------------------- the index's hook


def test_default_choice_is_the_calibrated_score_with_ties_to_the_more_specific_level():
    same = [candidate([1, 2], [1.0, 1.0], Level.CALL), candidate([3, 4], [1.0, 1.0], Level.GLOBAL)]
    assert by_calibrated_score(same) == 0
    weighed = [candidate([1, 2], [1.0, 1.0], Level.CALL, weight=0.5), candidate([3], [1.0], Level.GLOBAL)]
    assert by_calibrated_score(weighed) == 0  # 1.0 against 1.0: the tie goes to the call level
    heavier = [candidate([1, 2], [1.0, 0.4], Level.CALL, weight=0.5), candidate([3], [1.0], Level.GLOBAL)]
    assert by_calibrated_score(heavier) == 1  # 0.7 against 1.0


def test_the_index_drafts_what_its_chooser_picks_and_tells_it_where_the_call_stands():
    default = index_with_two_levels().propose("c")
    assert default.level is Level.CALL and default.token_ids[:3] == [4, 5, 6]

    chooser = Recording()
    index = index_with_two_levels(chooser)
    picked = index.propose("c")
    assert picked.level is Level.GLOBAL and picked.token_ids[:2] == [7, 7]
    levels, context = chooser.seen[-1]
    assert levels == [Level.CALL, Level.GLOBAL]
    assert context == ChoiceContext(position=3, last_drafted=0, last_accepted=0)

    index.record_verification("c", len(picked.token_ids), 1)
    index.extend_call("c", [7, 8])
    index.propose("c")
    assert chooser.seen[-1][1] == ChoiceContext(position=5, last_drafted=len(picked.token_ids), last_accepted=1)


def test_a_chooser_may_send_no_draft():
    index = index_with_two_levels(Never())
    assert index.propose("c").level is Level.NONE
    assert index.propose("c").token_ids == []
