from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from agentspec.replay import (
    ProposerSettings,
    builtin_proposers,
    make_proposer,
    proposer_names,
)
from agentspec.replay.baselines import NoProposer, TreeOracle
from agentspec.replay.calls import CallSpec
from agentspec.replay.driver_proposer import DriverProposer
from agentspec.replay.simulate import Tally, replay_call


class FakeIndex:
    """Records how the adapter drives the DraftIndex API."""

    def __init__(self) -> None:
        self.log: list[tuple] = []

    config = SimpleNamespace(max_sessions=8)

    def start_call(self, call_id, prompt, session_id=None, group_id=None, tenant="", policy_version=None):
        self.log.append(("start", call_id, list(prompt), session_id, group_id))
        return SimpleNamespace(new_tokens=len(prompt), reused_tokens=0)

    def has_call(self, call_id):
        return True

    def extend_call(self, call_id, tokens):
        self.log.append(("extend", list(tokens)))

    def propose(self, call_id, max_tokens=None, min_prob=0.0, *, calibrated=False):
        self.log.append(("propose",))
        return SimpleNamespace(token_ids=[11, 12, 99], probs=[0.9, 0.5, 0.2])

    def record_verification(self, call_id, drafted, accepted):
        self.log.append(("verify", drafted, accepted))

    def finish_call(self, call_id):
        self.log.append(("finish", call_id))

    def stats(self):
        return SimpleNamespace(memory_bytes=1234)


def test_agentspec_adapter_follows_the_index_api() -> None:
    index = FakeIndex()
    p = DriverProposer(index)
    spec = CallSpec("c1", "s1", "g1", "t", 0, "src")
    out = [10, 11, 12, 13]
    replay_call(p, spec, np.asarray([1, 2], np.int32), np.asarray(out, np.int32), out, Tally())
    assert index.log == [
        ("start", "c1", [1, 2], "s1", "g1"),
        ("extend", [10]),
        ("propose",),
        ("verify", 3, 2),
        ("extend", [11, 12, 13]),
        ("finish", "c1"),
    ]
    assert p.memory_bytes() == 1234


def test_agentspec_proposer_runs_on_the_real_index() -> None:
    pytest.importorskip("agentspec.index")
    p = make_proposer("agentspec", ProposerSettings())
    out = list(range(50, 90))
    tally = Tally()
    for i in range(2):  # the second call repeats the first's output
        spec = CallSpec(f"c{i}", "s", "g", "t", i, "src")
        prompt = np.asarray([1, 2, 3] + (out if i else []), np.int32)
        replay_call(p, spec, prompt, np.asarray(out, np.int32), out, tally)
    assert tally.steps < 2 * len(out)
    assert p.memory_bytes() > 0


def _make_null(settings: ProposerSettings) -> NoProposer:
    return NoProposer()


def test_callers_add_proposers_without_global_registration() -> None:
    extra = {"test-null": _make_null}
    assert "test-null" in proposer_names(extra)
    assert isinstance(make_proposer("test-null", ProposerSettings(), extra), NoProposer)
    # Nothing leaked into a shared table.
    assert "test-null" not in proposer_names() and "test-null" not in builtin_proposers()
    with pytest.raises(ValueError, match="unknown proposer 'test-null'"):
        make_proposer("test-null", ProposerSettings())


def test_oracle_indexes_session_streams_incrementally() -> None:
    o = TreeOracle(max_depth=16, max_nodes=32)
    a = CallSpec("a0", "s", "g", "t", 0, "src")
    o.begin_call(a, np.asarray([1, 2, 3], np.int32))
    o.observe("a0", np.asarray([4, 5], np.int32))
    o.end_call("a0")
    b = CallSpec("a1", "s", "g", "t", 1, "src")
    o.begin_call(b, np.asarray([1, 2, 3, 4, 5, 6], np.int32))  # extends the stream: adds [6]
    assert o._sessions["s"].n == 6 and o._next_seq == 1
    o.end_call("a1")
    c = CallSpec("a2", "s", "g", "t", 2, "src")
    o.begin_call(c, np.asarray([1, 2, 9], np.int32))  # a condensed prompt: new sequence
    assert o._next_seq == 2
    draft = o.propose("a2", np.asarray([3, 4], np.int32))
    assert draft.parents is not None and draft.token_ids[0] == 5


def test_held_tokens_count_what_each_index_keeps() -> None:
    pytest.importorskip("arctic_inference")
    suffix = make_proposer("vllm-suffix-0.32", ProposerSettings(suffix_cached_requests=2))
    corpus = make_proposer("vllm-suffix", ProposerSettings())
    agentspec = make_proposer("agentspec", ProposerSettings())
    out = np.arange(50, 70, dtype=np.int32)
    for i in range(3):
        spec = CallSpec(f"c{i}", "s", "g", "t", i, "src")
        prompt = np.arange(1, 11, dtype=np.int32)
        for p in (suffix, corpus, agentspec):
            p.begin_call(spec, prompt)
            if i == 0 and p is suffix:
                assert p.held_tokens() == 10  # the running request's prompt
            p.observe(spec.call_id, out)
            p.end_call(spec.call_id)
    # vLLM 0.32's suffix cache keeps the responses of its last 2 requests, no prompt.
    assert suffix.held_tokens() == 2 * len(out)
    # vLLM 0.34's corpus keeps every response with its prompt's last 3 tokens.
    assert corpus.held_tokens() == 3 * (3 + len(out))
    # agentspec keeps the session's stream (prompts and outputs) and each output again in
    # its group and in the global corpus.
    stats = agentspec.index.stats()
    assert (stats.session_tokens, stats.group_tokens, stats.global_tokens) == (90, 60, 60)
    assert agentspec.held_tokens() == 90 + 60 + 60
    assert make_proposer("oracle", ProposerSettings()).held_tokens() == 0  # cannot tell


def test_records_give_memory_per_held_token() -> None:
    from agentspec.replay import ReplayConfig, run_replay

    result = run_replay(ReplayConfig(proposers=("vllm-suffix", "agentspec", "oracle"), sources=("codet",), limit=3))
    for name in ("vllm-suffix", "agentspec"):
        per_token = result.record(name).bytes_per_held_token
        assert per_token is not None and 20 < per_token < 20_000, (name, per_token)
    assert result.record("oracle").bytes_per_held_token is None
