from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from agentspec.client.routing import pick_backend
from agentspec.driver import TokenSeed
from agentspec.replay import ReplayConfig, replay_workloads
from agentspec.replay.calls import CallSpec
from agentspec.replay.config import Routing
from agentspec.replay.proposer import Proposer, ProposerSettings, ReplayDraft
from agentspec.replay.simulate import (
    ClientRouting,
    Tally,
    accept_linear,
    accept_tree,
    interleave,
    replay_call,
    route,
)


class Scripted:
    """Drafts a fixed list per step (and records what it was told)."""

    def __init__(self, drafts: list[list[int]]) -> None:
        self.drafts = list(drafts)
        self.observed: list[list[int]] = []
        self.verdicts: list[tuple[int, int]] = []
        self.contexts: list[int] = []

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        self.prompt_len = len(prompt)

    def observe(self, call_id: str, tokens: np.ndarray) -> None:
        self.observed.append(tokens.tolist())

    def propose(self, call_id: str, context: np.ndarray) -> ReplayDraft:
        self.contexts.append(len(context))
        return ReplayDraft(self.drafts.pop(0) if self.drafts else [])

    def verified(self, call_id: str, drafted: int, accepted: int) -> None:
        self.verdicts.append((drafted, accepted))

    def end_call(self, call_id: str) -> None:
        pass

    def memory_bytes(self) -> int:
        return 0


def test_verification_accounting_by_hand(make_call) -> None:
    out = [10, 11, 12, 13, 14, 15, 16]
    call = make_call("t", 0, [1, 2, 3], out)
    # step 1 (prefill): emits 10. step 2: draft [11, 12, 99] -> 2 accepted + bonus 13.
    # step 3: draft [14, 15, 16, 17] -> 3 accepted, the request ends (no bonus past it).
    p = Scripted([[11, 12, 99], [14, 15, 16, 17]])
    t = Tally()
    replay_call(p, call.spec, call.prompt(), call.output(), out, t)
    assert (t.calls, t.output_tokens, t.steps) == (1, 7, 3)
    assert (t.drafted_tokens, t.accepted_tokens, t.proposals) == (7, 5, 2)
    assert p.observed == [[10], [11, 12, 13], [14, 15, 16]]
    assert p.verdicts == [(3, 2), (4, 3)]
    assert p.contexts == [3 + 1, 3 + 4]  # prompt + output so far


def test_seeds_reach_the_agentspec_index_before_the_call(make_call) -> None:
    from agentspec.replay.driver_proposer import DriverProposer, make_agentspec_index

    out = [7, 8, 9, 10]
    call = make_call("t", 0, [1, 2, 3], out)
    proposer = DriverProposer(make_agentspec_index(ProposerSettings()))
    seed = TokenSeed((20, 21, 22, 7, 8, 9, 10))  # what a condenser dropped: the output quotes it
    tally = Tally()
    replay_call(proposer, call.spec, call.prompt(), call.output(), out, tally, seeds=(seed,))
    stats = proposer.index.session_stats(call.spec.session_id)
    assert stats is not None and stats.seeded_tokens_by_kind == {"prior_turn": 7}
    assert tally.accepted_tokens > 0  # drafted from the seed
    # vLLM's suffix method takes no seeds: the same call drafts nothing from them.
    from agentspec.replay.baselines import NoProposer

    bare = Tally()
    replay_call(NoProposer(), call.spec, call.prompt(), call.output(), out, bare, seeds=(seed,))
    assert bare.accepted_tokens == 0


def test_no_speculation_is_one_token_per_step(make_call) -> None:
    call = make_call("t", 0, [1], [5, 6, 7])
    t = Tally()
    replay_call(Scripted([]), call.spec, call.prompt(), call.output(), [5, 6, 7], t)
    assert t.steps == 3 and t.drafted_tokens == 0


def test_two_turn_agent_hand_computed_al(two_turn_agent) -> None:
    config = ReplayConfig(
        proposers=("none", "vllm-ngram", "vllm-suffix", "vllm-suffix-0.32", "oracle"),
        concurrency=1,
        proposer_settings=ProposerSettings(ngram_impl="numpy"),
    )
    (res,) = replay_workloads(config, {"toy": two_turn_agent})
    al = {name: t.output_tokens / t.steps for name, t in res.tallies.items()}
    # Turn 1 has nothing to draft from: 5 steps for everyone.
    # none: 5 + 5 steps.
    assert res.tallies["none"].steps == 10
    # oracle: turn 2 = prefill (10), then the stream holds 10 -> 11 12 13 14: one step.
    assert res.tallies["oracle"].steps == 5 + 2
    # vllm-suffix-0.32 (factor 1.0: a draft is at most as long as its match): after the
    # prefill's 10 the match "10" is 1 long -> draft [11], emits 11 12; then "10 11 12" -> 13 14 end.
    assert res.tallies["vllm-suffix-0.32"].steps == 5 + 3
    # vllm-suffix (0.34: 8 tokens whatever the match): after the prefill's 10 the prompt's
    # "10" continues 11 12 13 14 4 10 (+ filler) -> 11 12 13 14 accepted, the request ends.
    assert res.tallies["vllm-suffix"].steps == 5 + 2
    assert res.tallies["vllm-suffix"].drafted_tokens == 5 * 8
    # vllm-ngram (n >= 2): turn 2 after 10: the bigram "4 10" never occurred -> no draft;
    # after "10 11": draft 12 13 14 4 ... -> 12 13 14 accepted, request ends.
    assert res.tallies["vllm-ngram"].steps == 5 + 3
    assert al["oracle"] == 10 / 7 and al["none"] == 1.0


def test_accept_linear() -> None:
    out = [1, 2, 3, 4]
    assert accept_linear([2, 3, 9], out, 1) == 2
    assert accept_linear([2, 3, 4, 5, 6], out, 1) == 3
    assert accept_linear([], out, 0) == 0


def test_accept_tree_takes_the_longest_matching_root_path() -> None:
    out = [7, 1, 2, 3, 4]
    # roots: 1 (0), 5 (1); children of 1: 9 (2), 2 (3); child of 2: 3 (4); child of 3: 8 (5)
    tokens = [1, 5, 9, 2, 3, 8]
    parents = [-1, -1, 0, 0, 3, 4]
    # From pos 1 the truth is 1 2 3 4: path 1-2-3 matches, 8 != 4 follows it.
    assert accept_tree(tokens, parents, out, 1) == (3, 4)
    # From pos 0 the truth starts with 7: nothing matches, one token would be drafted.
    assert accept_tree(tokens, parents, out, 0) == (0, 1)
    # A path that ends exactly at a leaf: nothing more is drafted.
    assert accept_tree([1, 2], [-1, 0], out, 1) == (2, 2)


def _spec(traj: str, turn: int, session: str, group: str) -> CallSpec:
    return CallSpec(f"{traj}#{turn}", session, group, traj, turn, "s")


def test_routing_pins_as_stated() -> None:
    calls = [_spec(f"t{i}", j, f"t{i}", f"g{i % 3}") for i in range(30) for j in range(6)]
    for policy, key in ((Routing.SESSION, "session_id"), (Routing.GROUP, "group_id")):
        seen: dict[str, set[int]] = {}
        for c in calls:
            seen.setdefault(getattr(c, key), set()).add(route(c, policy, 8))
        assert all(len(r) == 1 for r in seen.values())
    spread = Counter(route(c, Routing.SPREAD, 8) for c in calls)
    assert len(spread) == 8  # spread hashes each call: all replicas get calls
    by_traj = {c.trajectory_id: set() for c in calls}
    for c in calls:
        by_traj[c.trajectory_id].add(route(c, Routing.SPREAD, 8))
    assert max(len(r) for r in by_traj.values()) > 1
    # Stable across processes and runs (blake2, not Python's salted hash).
    assert route(_spec("t0", 0, "t0", "g0"), Routing.SPREAD, 1000) == route(
        _spec("t0", 0, "x", "y"), Routing.SPREAD, 1000
    )
    assert all(route(c, Routing.SPREAD, 1) == 0 for c in calls)


def test_client_routing_pins_groups_as_the_client_does_and_bounds_load() -> None:
    # 12 groups of 4 trajectories (2 calls each), all in flight at once on 4 replicas.
    trajectories = [
        [_spec(f"g{g}t{t}", j, f"g{g}t{t}", f"g{g}") for j in range(2)] for g in range(12) for t in range(4)
    ]
    counts = {c.trajectory_id: 2 for traj in trajectories for c in traj}
    router = ClientRouting(4, counts)
    where: dict[str, set[int]] = {}
    for traj in trajectories:
        where.setdefault(traj[0].group_id, set()).add(router.route(traj[0]))
    assert all(len(r) == 1 for r in where.values())  # a group on one replica
    per_replica = Counter(next(iter(r)) for r in where.values())
    assert max(per_replica.values()) <= 4  # bounded load: ceil(1.25 * 48 / 4) sessions = 4 groups of 4
    # The first group lands where the client itself would put it (rendezvous, idle fleet).
    first = pick_backend("g0", [f"replica-{r}" for r in range(4)], {}, 1.25)
    assert where["g0"] == {int(first.removeprefix("replica-"))}
    # Once every trajectory has made its last call, the pins are gone.
    for traj in trajectories:
        router.route(traj[1])
        router.done(traj[0])
        router.done(traj[1])
    assert router._table.loads() == {}
    with pytest.raises(ValueError, match="ClientRouting"):
        route(trajectories[0][0], Routing.CLIENT, 4)


def test_replicas_keep_state_per_server(make_call) -> None:
    out = list(range(100, 140))
    # Two sessions of one group: the second repeats the first's output.
    wl = [[make_call("a", 0, [1, 2], out, group="g")], [make_call("b", 0, [3, 4], out, group="g")]]
    pinned = ReplayConfig(proposers=("oracle",), replicas=64, default_routing=Routing.GROUP, concurrency=1)
    (res,) = replay_workloads(pinned, {"toy": wl})
    assert res.tallies["oracle"].steps < 40 + 40  # b drafts from a's output
    # Sessions on different replicas (the two session ids hash apart for 64 replicas).
    by_session = ReplayConfig(proposers=("oracle",), replicas=64, default_routing=Routing.SESSION, concurrency=1)
    assert route(wl[0][0].spec, Routing.SESSION, 64) != route(wl[1][0].spec, Routing.SESSION, 64)
    (res2,) = replay_workloads(by_session, {"toy": wl})
    assert res2.tallies["oracle"].steps == 80


def test_interleave_round_robin() -> None:
    trajs = [[f"a{i}" for i in range(3)], ["b0"], [f"c{i}" for i in range(2)], ["d0"]]
    got = list(interleave(trajs, 2))  # type: ignore[arg-type]
    assert got == ["a0", "b0", "a1", "c0", "a2", "c1", "d0"]
    assert list(interleave(trajs, 1)) == ["a0", "a1", "a2", "b0", "c0", "c1", "d0"]  # type: ignore[arg-type]
    assert sorted(interleave(trajs, 100)) == sorted(x for t in trajs for x in t)  # type: ignore[arg-type]


def _make_copy_last_output(settings: ProposerSettings) -> Proposer:
    return _CopyLastOutput()


class _CopyLastOutput:
    """A caller's own proposer: drafts the previous call's whole output."""

    def __init__(self) -> None:
        self.last: list[int] = []
        self.current: list[int] = []

    def begin_call(self, call, prompt, seeds=()) -> None:
        self.current = []

    def observe(self, call_id, tokens) -> None:
        self.current.extend(int(t) for t in tokens)

    def propose(self, call_id, context) -> ReplayDraft:
        done = len(self.current)
        return ReplayDraft(self.last[done:]) if self.last[:done] == self.current else ReplayDraft([])

    def verified(self, call_id, drafted, accepted) -> None:
        pass

    def end_call(self, call_id) -> None:
        self.last = self.current

    def memory_bytes(self) -> int:
        return 0


def test_caller_supplied_proposers_run_beside_the_builtin_ones(two_turn_agent) -> None:
    config = ReplayConfig(proposers=("none", "copy-last"), concurrency=1)
    (res,) = replay_workloads(config, {"toy": two_turn_agent}, proposers={"copy-last": _make_copy_last_output})
    # Turn 1: nothing to copy, 5 steps. Turn 2: the prefill emits 10, then the draft
    # 11 12 13 14 is accepted whole in one step.
    assert res.tallies["copy-last"].steps == 5 + 2
    assert res.tallies["none"].steps == 10


def test_caller_supplied_proposers_reach_worker_processes(tmp_path) -> None:
    from agentspec.replay import run_replay

    config = ReplayConfig(
        sources=("tau_bench", "tot"), limit=1, proposers=("none", "copy-last"), jobs=2, cache_dir=tmp_path
    )
    result = run_replay(config, proposers={"copy-last": _make_copy_last_output})
    for source in ("tau_bench", "tot"):
        ours, none = result.record("copy-last", source), result.record("none", source)
        assert ours.calls == none.calls > 0 and ours.output_tokens == none.output_tokens
        assert ours.steps <= none.steps  # it ran (a draft can only save steps)
    assert result.record("copy-last").drafted_tokens > 0


def test_exchanging_replicas_draft_each_others_outputs(make_call) -> None:
    out = list(range(100, 140))
    # Two groups pinned apart; b's output repeats a's, which only an exchange brings to b's replica.
    wl = [[make_call("a", 0, [1, 2], out, group="g1")], [make_call("b", 0, [3, 4, 100, 101], out, group="g2")]]
    replicas = 2
    assert route(wl[0][0].spec, Routing.GROUP, replicas) != route(wl[1][0].spec, Routing.GROUP, replicas)
    config = ReplayConfig(proposers=("agentspec", "oracle"), replicas=replicas, concurrency=1)
    (apart,) = replay_workloads(config, {"toy": wl})
    (shared,) = replay_workloads(config.model_copy(update={"exchange": True}), {"toy": wl})
    # Without the exchange b starts cold on its replica; with it, b drafts a's output.
    assert shared.tallies["agentspec"].steps < apart.tallies["agentspec"].steps - 20
    assert shared.tallies["agentspec"].index_ns > 0
    # The oracle cannot exchange: it runs as before.
    assert shared.tallies["oracle"].steps == apart.tallies["oracle"].steps
    # One server has nobody to exchange with: the flag changes nothing, for any proposer.
    one = ReplayConfig(proposers=("vllm-suffix", "agentspec"), concurrency=1)
    (alone,) = replay_workloads(one, {"toy": wl})
    (alone_x,) = replay_workloads(one.model_copy(update={"exchange": True}), {"toy": wl})
    assert {n: t.steps for n, t in alone.tallies.items()} == {n: t.steps for n, t in alone_x.tallies.items()}


def test_an_exchange_lag_delivers_outputs_that_many_calls_later(make_call) -> None:
    out = list(range(100, 140))
    # a's output (call 1) is repeated by b at call 2, and by c at call 4; lag 2 calls: it
    # reaches the other replicas after call 3, too late for b, in time for c.
    wl = [
        [make_call("a", 0, [1, 2], out, group="g1")],
        [make_call("b", 0, [3, 4, 100, 101], out, group="g2")],
        [make_call("x", 0, [5, 6], [7, 8, 9], group="g3")],
        [make_call("c", 0, [3, 4, 100, 101], out, group="g5")],
    ]
    replicas = 8
    routes = {call.spec.group_id: route(call.spec, Routing.GROUP, replicas) for (call,) in wl}
    assert len({routes["g1"], routes["g2"], routes["g5"]}) == 3
    config = ReplayConfig(proposers=("agentspec",), replicas=replicas, concurrency=1, exchange=True)

    def steps(lag: int) -> int:
        (result,) = replay_workloads(config.model_copy(update={"exchange_lag": lag}), {"toy": wl})
        return result.tallies["agentspec"].steps

    now, late, never = steps(0), steps(2), steps(10)
    # At once, both b and c draft a's output; 2 calls late only c does; 10 calls late neither.
    assert now < late - 20 and late < never - 20
    with pytest.raises(ValueError, match="exchange_lag"):
        ReplayConfig(exchange_lag=-1)


def test_sharing_is_off_unless_started() -> None:
    from agentspec.replay.driver_proposer import make_agentspec

    p = make_agentspec(ProposerSettings())
    spec = CallSpec(call_id="c", session_id="s", group_id=None, trajectory_id="s", turn=0, source="toy")
    p.begin_call(spec, np.array([1, 2, 3], dtype=np.int32))
    p.observe("c", np.array([7, 8], dtype=np.int32))
    p.end_call("c")
    assert p.take_shared_outputs() == []  # nothing kept: a replay without exchange never drains
    p.start_sharing()
    p.begin_call(spec, np.array([1, 2, 3, 7, 8], dtype=np.int32))
    p.observe("c", np.array([9], dtype=np.int32))
    p.end_call("c")
    assert [o.tolist() for o in p.take_shared_outputs()] == [[9]]
    assert p.take_shared_outputs() == []


def _random_agents(agent_call, rng: np.random.Generator, trajectories: int, turns: int) -> list[list]:
    """Agent loops in groups of two siblings that share their first prompt and output."""
    wl = []
    for t in range(trajectories):
        first = rng.integers(100, 200, 30).tolist()
        out = rng.integers(200, 300, 40).tolist() if t % 2 == 0 else wl[-1][0].output().tolist()
        if t % 2:
            first = wl[-1][0].prompt().tolist()
        calls, prompt, output = [], first, out
        for turn in range(turns):
            calls.append(agent_call(f"t{t}", turn, prompt, output, group=f"g{t // 2}"))
            prompt = [*prompt, *output, *rng.integers(100, 300, 5).tolist()]
            output = [*output[10:], *rng.integers(200, 300, 10).tolist()]
        wl.append(calls)
    return wl


def test_lockstep_at_concurrency_one_is_the_sequential_replay(make_call, rng) -> None:
    wl = _random_agents(make_call, rng, trajectories=4, turns=3)
    config = ReplayConfig(proposers=("vllm-suffix", "agentspec", "oracle"), concurrency=1)
    (seq,) = replay_workloads(config, {"toy": wl})
    (lock,) = replay_workloads(config.model_copy(update={"lockstep": True}), {"toy": wl})
    for name in config.proposers:
        a, b = seq.tallies[name], lock.tallies[name]
        assert (a.calls, a.steps, a.drafted_tokens, a.accepted_tokens, a.outcomes) == (
            b.calls,
            b.steps,
            b.drafted_tokens,
            b.accepted_tokens,
            b.outcomes,
        ), name


def test_lockstep_siblings_in_flight_see_partial_outputs(make_call, rng) -> None:
    """Two siblings with the same prompt and output: one after the other, the second
    drafts the first's whole output; in lockstep they decode side by side, and the
    second sees only what the first has emitted so far."""
    wl = _random_agents(make_call, rng, trajectories=2, turns=1)
    config = ReplayConfig(proposers=("agentspec",), concurrency=2)
    (seq,) = replay_workloads(config, {"toy": wl})
    (lock,) = replay_workloads(config.model_copy(update={"lockstep": True}), {"toy": wl})
    assert seq.tallies["agentspec"].calls == lock.tallies["agentspec"].calls == 2
    seq_t, lock_t = seq.tallies["agentspec"], lock.tallies["agentspec"]
    assert lock_t.steps > seq_t.steps
    # One after the other, the second sibling drafts the first's output in long runs; side
    # by side, only what the first emitted a step ahead (a token or two per draft).
    assert max(d for d, a in seq_t.outcomes if a) >= 8
    assert max(d for d, a in lock_t.outcomes if a) <= 2


class _InFlight(Scripted):
    """Records each call's start and end, and how many calls were in flight."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        super().__init__([])
        self.log = log

    def begin_call(self, call: CallSpec, prompt: np.ndarray, seeds: Sequence[TokenSeed] = ()) -> None:
        self.log.append(("begin", call.call_id))

    def end_call(self, call_id: str) -> None:
        self.log.append(("end", call_id))


def test_lockstep_keeps_turn_order_and_concurrency(make_call, rng) -> None:
    wl = _random_agents(make_call, rng, trajectories=5, turns=3)
    log: list[tuple[str, str]] = []
    config = ReplayConfig(proposers=("spy",), concurrency=2, lockstep=True)
    replay_workloads(config, {"toy": wl}, proposers={"spy": lambda s: _InFlight(log)})
    begun = [cid for event, cid in log if event == "begin"]
    assert sorted(begun) == sorted(call.spec.call_id for t in wl for call in t)  # each call once
    for t in range(5):  # a trajectory's turns in order, each after the previous ended
        mine = [(e, cid) for e, cid in log if cid.startswith(f"t{t}#")]
        assert mine == [(e, f"t{t}#{turn}") for turn in range(3) for e in ("begin", "end")]
    in_flight = peak = 0
    for event, _ in log:
        in_flight += 1 if event == "begin" else -1
        peak = max(peak, in_flight)
    assert peak == 2


def test_lockstep_batches_cap_agentspec_drafts_as_the_server_budget_does() -> None:
    from agentspec.index import DraftIndex
    from agentspec.replay.driver_proposer import DriverProposer
    from agentspec.replay.proposer import BatchAware

    text = list(range(100, 160))
    proposer = DriverProposer(DraftIndex())
    assert isinstance(proposer, BatchAware)
    spec = CallSpec("c", "s", "g", "s", 0, "toy")
    # The prompt holds the text twice; the call has emitted its first 5 tokens again.
    proposer.begin_call(spec, np.asarray(text + text, dtype=np.int32))
    proposer.observe("c", np.asarray(text[:5], dtype=np.int32))
    context = np.asarray(text + text + text[:5], dtype=np.int32)
    lengths = {}
    for batch in (1, 8, 12, 20, 65):
        proposer.set_batch_size(batch)
        lengths[batch] = len(proposer.propose("c", context).token_ids)
        proposer.driver.withdraw("c")  # not verified: the next proposal starts afresh
    # k = 32 (the policy's longest draft): full up to 8 requests, halved per doubling, none above 64.
    assert lengths == {1: 32, 8: 32, 12: 16, 20: 8, 65: 0}
