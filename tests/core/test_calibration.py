"""Level calibration: overconfident levels lose the choice between levels."""

from __future__ import annotations

import pytest

from agentspec import DraftIndex, DraftPolicy, IndexConfig, Level
from agentspec.index.calibration import LevelCalibration


def test_weight_starts_at_one_and_follows_accepted_over_expected():
    cal = LevelCalibration(prior=10.0)
    assert cal.weight("global") == 1.0
    cal.observe("global", expected=30.0, accepted=0)
    assert cal.weight("global") == pytest.approx(10 / 40)
    cal.observe("call", expected=10.0, accepted=10)
    assert cal.weight("call") == pytest.approx(1.0)
    assert cal.weights() == {"global": pytest.approx(0.25), "call": pytest.approx(1.0)}


def test_window_halves_old_evidence_so_new_evidence_counts():
    cal = LevelCalibration(prior=1.0, window=100.0)
    for _ in range(20):
        cal.observe("group", expected=10.0, accepted=0)  # a bad stretch
    bad = cal.weight("group")
    for _ in range(20):
        cal.observe("group", expected=10.0, accepted=10)  # the workload changed
    assert bad < 0.05
    assert cal.weight("group") > 0.9  # without the window it would be 0.5


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="positive"):
        LevelCalibration(prior=0.0)


def _index_where_global_outbids_the_session(calibrate: bool) -> DraftIndex:
    index = DraftIndex(IndexConfig(policy=DraftPolicy(calibrate_levels=calibrate)))
    index.start_call("other", [1])
    index.extend_call("other", [19, 20, 21, 22, 23, 24, 25, 26, 27])
    index.finish_call("other")
    index.seed([20, 21, 30, 31, 32, 33], session_id="s")
    index.start_call("c", [5, 19, 20, 21], session_id="s")
    return index


@pytest.mark.parametrize("calibrate", [True, False])
def test_rejected_global_drafts_hand_the_choice_to_the_session(calibrate):
    index = _index_where_global_outbids_the_session(calibrate)
    draft = index.propose("c")
    # A 3-token match in the global corpus outscores the session seed's 2-token match.
    assert (draft.level, draft.token_ids[:2]) == (Level.GLOBAL, [22, 23])
    # The target model keeps rejecting the global corpus's drafts and accepting the session's.
    for _ in range(30):
        draft = index.propose("c")
        accepted = len(draft.token_ids) if draft.level is Level.SESSION else 0
        index.record_verification("c", drafted=len(draft.token_ids), accepted=accepted)
    draft = index.propose("c")
    if calibrate:
        weights = index.level_weights()
        assert weights["global"] < 2 / 3 < weights["session"]  # 2/3: the two drafts' score ratio
        assert (draft.level, draft.token_ids[:2]) == (Level.SESSION, [30, 31])
    else:
        assert index.level_weights() == {}
        assert draft.level is Level.GLOBAL
