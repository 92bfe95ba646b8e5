"""The step replay redoes logged steps and says where it parts from the log.

Hand-written logs here; tests/engine/test_fidelity.py replays a real server's log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentspec.engine.worker.step_log import StepLog, read_step_log, step_log_path
from agentspec.index import DraftIndex
from agentspec.replay.step_replay import LoggedCall, replay_steps, requests_by_session

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
OUTPUT = [20, 21, 22, 23]


def _undrafted_log(req: str = "r1", session: str = "s1") -> list[dict]:
    """A request decoded without drafts (cap 0 at every step: the budget was off)."""
    events: list[dict] = [
        {"e": "start", "k": 8, "max_model_len": 4096},
        {"e": "add", "req": req, "session": session, "group": None, "max_tokens": len(OUTPUT), "stops": []},
    ]
    for _ in OUTPUT:
        events.append({"e": "step", "batch": 80, "rows": [["other", 1, 0, 0], [req, 1, 0, 0]]})
    events.append({"e": "end", "req": [req]})
    return events


def test_a_log_the_replay_agrees_with() -> None:
    result = replay_steps(_undrafted_log(), {"r1": LoggedCall(PROMPT, OUTPUT)}, DraftIndex())
    assert result.mismatches == []
    assert (result.steps, result.rows, result.max_batch) == (4, 4, 80)
    assert result.limited_rows == 4  # cap 0 < k 8 at every step
    assert result.session_totals("s1") == (0, 0)
    stats = result.index.session_stats("s1")
    assert stats is not None and stats.calls == 1


def test_a_different_draft_or_emission_is_reported_at_its_step() -> None:
    events = _undrafted_log()
    events[3]["rows"][1] = ["r1", 1, 0, 3]  # the server drafted 3 tokens; a cap of 0 drafts none
    events[4]["rows"][1] = ["r1", 2, 0, 0]  # the server emitted 2 tokens; undrafted steps emit 1
    result = replay_steps(events, {"r1": LoggedCall(PROMPT, OUTPUT)}, DraftIndex())
    found = [(m.step, m.what, m.server, m.replay) for m in result.mismatches]
    assert found == [(2, "drafted", 3, 0), (3, "emitted", 2, 1)]


def test_only_the_given_requests_are_replayed() -> None:
    result = replay_steps(_undrafted_log(), {}, DraftIndex())
    assert result.rows == 0 and result.session_totals("s1") == (0, 0)


def test_requests_by_session_keeps_arrival_order() -> None:
    events = [*_undrafted_log("a"), *_undrafted_log("b"), *_undrafted_log("c", session="s2")]
    assert requests_by_session(events) == {"s1": ["a", "b"], "s2": ["c"]}


def test_the_log_round_trips_and_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    path = step_log_path(tmp_path / "logs", "proposer-dp0")
    log = StepLog(path)
    log.started(8, 4096)
    log.added("r1", "s1", "g1", 16, {3, 2})
    log.step(2, [("r1", 1, 8, 5)])
    log.finished(["r1"])
    log.close()
    with open(path, "a") as f:
        f.write('{"e": "st')  # the engine died mid-line
    assert read_step_log(path) == [
        {"e": "start", "k": 8, "max_model_len": 4096},
        {"e": "add", "req": "r1", "session": "s1", "group": "g1", "max_tokens": 16, "stops": [2, 3]},
        {"e": "step", "batch": 2, "rows": [["r1", 1, 8, 5]]},
        {"e": "end", "req": ["r1"]},
    ]


def test_a_damaged_line_inside_the_log_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join([json.dumps({"e": "start", "k": 8}), "garbage", json.dumps({"e": "end", "req": []})]))
    with pytest.raises(ValueError, match=r"steps.jsonl:2: not a step log event"):
        read_step_log(path)


def test_a_steps_probability_cut_is_replayed_as_logged() -> None:
    # The prompt holds [1, 2, 3, 4, 5] twice, followed by 6 once and by 9 once: after the
    # prefill's token (5) the call's draft runs at path probability 1/3 (6, 9, or nothing yet).
    prompt = [1, 2, 3, 4, 5, 6, 60, 61, 1, 2, 3, 4, 5, 9, 90, 91, 1, 2, 3, 4]
    output = [5, 6, 60, 61]

    def log(step: dict) -> list[dict]:
        return [
            {"e": "start", "k": 8, "max_model_len": 4096},
            {"e": "add", "req": "r1", "session": "s1", "group": None, "max_tokens": 4, "stops": []},
            step,
        ]

    calls = {"r1": LoggedCall(prompt, output)}
    uncut = replay_steps(log({"e": "step", "batch": 1, "rows": [["r1", 1, 8, 8]]}), calls, DraftIndex())
    assert uncut.mismatches == []
    # A model budget cut that step's drafts at 0.4: the server drafted nothing, and so does
    # the replay, because it applies the logged cut.
    cut = {"e": "step", "batch": 64, "rows": [["r1", 1, 8, 0]], "min_prob": 0.4}
    assert replay_steps(log(cut), calls, DraftIndex()).mismatches == []
    cut.pop("min_prob")
    assert [m.what for m in replay_steps(log(cut), calls, DraftIndex()).mismatches] == ["drafted"]


def test_the_log_keeps_a_steps_probability_cut(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    log = StepLog(path)
    log.step(64, [("r1", 1, 8, 2)], min_prob=0.4)
    log.step(1, [("r1", 1, 8, 5)])
    log.close()
    assert read_step_log(path) == [
        {"e": "step", "batch": 64, "rows": [["r1", 1, 8, 2]], "min_prob": 0.4},
        {"e": "step", "batch": 1, "rows": [["r1", 1, 8, 5]]},
    ]
