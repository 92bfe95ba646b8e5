from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from agentspec.replay.trajectories import (
    DataFormatError,
    Message,
    expand_turns,
    load_trajectories,
    parse_trajectory,
    raw_window,
    select_window,
)


def m(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def test_prefix_len_expansion_restores_contexts() -> None:
    raw = [
        {"messages_in": [m("system", "S"), m("user", "U1")], "output": "A1"},
        {"prefix_len": 2, "messages_in_delta": [m("assistant", "A1"), m("user", "U2")], "output": "A2"},
        # A condenser-like cut: keep only the system message, then new text.
        {"prefix_len": 1, "messages_in_delta": [m("user", "summary")], "output": "A3"},
    ]
    turns = expand_turns(raw)
    assert [t.output for t in turns] == ["A1", "A2", "A3"]
    assert turns[1].messages == (
        Message("system", "S"),
        Message("user", "U1"),
        Message("assistant", "A1"),
        Message("user", "U2"),
    )
    assert turns[2].messages == (Message("system", "S"), Message("user", "summary"))


def test_prefix_len_out_of_range_is_an_error() -> None:
    with pytest.raises(DataFormatError):
        expand_turns([{"prefix_len": 1, "messages_in_delta": [], "output": ""}])


def test_sessions_and_groups() -> None:
    turns = [{"messages_in": [m("prompt", "p")], "output": "o"}] * 3
    samples = parse_trajectory({"id": "s", "source": "x", "task": "t", "kind": "samples", "turns": turns})
    assert samples.group_id == "s"
    assert [samples.session_id(i) for i in range(3)] == ["s/0", "s/1", "s/2"]
    agent = parse_trajectory({"id": "a", "source": "x", "task": "t", "kind": "agent", "turns": turns})
    assert agent.group_id == "x/t"
    assert {agent.session_id(i) for i in range(3)} == {"a"}


def test_load_filters_sources(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.gz"
    rows = [
        {
            "id": f"{s}{i}",
            "source": s,
            "task": "t",
            "kind": "agent",
            "turns": [{"messages_in": [], "output": ""}],
        }
        for s in ("a", "b")
        for i in range(2)
    ]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in rows))
    got = load_trajectories(path, ["b"])
    assert list(got) == ["b"] and [t.id for t in got["b"]] == ["b0", "b1"]


ROLES = ["system", "user", "assistant", "user", "assistant", "user"]


def test_window_keeps_everything_that_fits() -> None:
    assert select_window(ROLES, [10] * 6, window=100) == list(range(6))
    assert select_window(ROLES, [10] * 6, window=None) == list(range(6))


def test_window_keeps_head_and_most_recent() -> None:
    # head = system + first user (20 tokens) + 3 reserved; 35 - 23 = 12 -> one more message.
    assert select_window(ROLES, [10] * 6, window=35, reserve=3) == [0, 1, 5]
    assert select_window(ROLES, [10] * 6, window=43, reserve=3) == [0, 1, 4, 5]


def test_window_drops_a_contiguous_middle() -> None:
    # The newest message does not fit: nothing older is cherry-picked past it.
    assert select_window(ROLES, [10, 10, 1, 1, 1, 50], window=40) == [0, 1]


def test_window_keeps_an_oversized_head_and_raw_prompts() -> None:
    assert select_window(ROLES, [100, 100, 1, 1, 1, 1], window=10) == [0, 1]
    assert select_window(["prompt"], [1000], window=10) == [0]


def test_raw_window_cuts_the_middle() -> None:
    assert raw_window(10, None) is None and raw_window(10, 10) is None
    assert raw_window(100, 10) == (5, 95)
    assert raw_window(100, 11) == (5, 94)
