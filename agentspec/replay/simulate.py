"""The replay loop: topology, routing, interleaving and greedy verification.

Every recorded call is decoded again, step by step, against its recorded output.
With greedy sampling the target model's next token is known (it is the recorded
one), so a draft's fate is exact: the longest prefix of the draft that equals the
true continuation is accepted, and the step also emits one token of its own (the
"bonus" token), as vLLM's rejection sampler does at temperature 0. As in vLLM, a
request's first output token comes from the prefill step, which drafts nothing;
the drafter first runs after it, with the prompt and that token.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from agentspec.driver import TokenSeed
from agentspec.index.types import cut_length
from agentspec.replay.calls import CallSpec, ReplayCall, SourceWorkload
from agentspec.replay.config import Routing
from agentspec.replay.proposer import (
    BatchAware,
    CountsSteps,
    DraftsWholeCalls,
    Proposer,
    ReplayDraft,
    SharesOutputs,
)

_now = time.perf_counter_ns


@dataclass(slots=True)
class Tally:
    """Counts and timings of one proposer over a set of calls."""

    calls: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    steps: int = 0
    proposals: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    index_ns: int = 0
    propose_ns: int = 0
    peak_memory_bytes: int = 0
    #: Tokens the index held when its memory peaked (0: the proposer cannot tell).
    held_tokens_at_peak: int = 0
    #: Context tokens summed over proposals (the KV cache each decoding step reads).
    context_tokens: int = 0
    #: Proposals by outcome: ``(drafted, accepted) -> count`` (agentspec.draft_budget.speed_model.DraftOutcomes).
    outcomes: dict[tuple[int, int], int] = field(default_factory=dict)
    #: The same under each probability cut of a batch budget (agentspec.draft_budget.speed_budget), for
    #: proposers whose drafts carry path probabilities (empty otherwise).
    cut_outcomes: dict[float, dict[tuple[int, int], int]] = field(default_factory=dict)
    #: Counters a proposer keeps of its own (:class:`~agentspec.replay.proposer.CountsSteps`),
    #: summed over its servers.
    counters: dict[str, int] = field(default_factory=dict)

    def add(self, other: Tally) -> None:
        for f in fields(self):
            if f.name == "peak_memory_bytes":
                # Sources run on their own fresh servers: the peak is the largest.
                if other.peak_memory_bytes > self.peak_memory_bytes:
                    self.peak_memory_bytes = other.peak_memory_bytes
                    self.held_tokens_at_peak = other.held_tokens_at_peak
            elif f.name == "held_tokens_at_peak":
                continue  # goes with the peak above
            elif f.name == "outcomes":
                _merge(self.outcomes, other.outcomes)
            elif f.name == "counters":
                for key, n in other.counters.items():
                    self.counters[key] = self.counters.get(key, 0) + n
            elif f.name == "cut_outcomes":
                for cut, counts in other.cut_outcomes.items():
                    _merge(self.cut_outcomes.setdefault(cut, {}), counts)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def _merge(into: dict[tuple[int, int], int], counts: dict[tuple[int, int], int]) -> None:
    for key, n in counts.items():
        into[key] = into.get(key, 0) + n


@dataclass(slots=True)
class SourceResult:
    source: str
    trajectories: int
    tallies: dict[str, Tally] = field(default_factory=dict)
    wall_s: float = 0.0


def stable_hash(key: str) -> int:
    """A hash that is the same in every process and run (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def route(spec: CallSpec, policy: Routing, replicas: int) -> int:
    """The replica that serves a call (for :attr:`Routing.CLIENT`, see :class:`ClientRouting`)."""
    if replicas == 1:
        return 0
    if policy is Routing.CLIENT:
        raise ValueError("Routing.CLIENT depends on the trajectories in flight: use ClientRouting")
    if policy is Routing.SPREAD:
        key = f"{spec.trajectory_id}#{spec.turn}"
    elif policy is Routing.SESSION:
        key = spec.session_id
    else:
        key = spec.group_id
    return stable_hash(key) % replicas


def interleave(trajectories: Sequence[Sequence[ReplayCall]], concurrency: int) -> Iterator[ReplayCall]:
    """Calls in the order a fleet of ``concurrency`` concurrent agents sends them.

    ``concurrency`` trajectories are active; one turn of each is taken in turn
    (round robin); a finished trajectory's slot goes to the next one in order.
    """
    pending = iter(trajectories)
    slots: list[Iterator[ReplayCall]] = []
    for t in pending:
        slots.append(iter(t))
        if len(slots) == concurrency:
            break
    while slots:
        alive: list[Iterator[ReplayCall]] = []
        for it in slots:
            call = next(it, None)
            if call is None:
                # Refill in place so the next trajectory joins this round's order.
                nxt = next(pending, None)
                while nxt is not None:
                    it = iter(nxt)
                    call = next(it, None)
                    if call is not None:
                        break
                    nxt = next(pending, None)
                if call is None:
                    continue
            alive.append(it)
            yield call
        slots = alive


def accept_linear(draft: Sequence[int], output: list[int], pos: int) -> int:
    """Length of the longest draft prefix equal to ``output[pos:]``."""
    n = 0
    for a, b in zip(draft, output[pos : pos + len(draft)], strict=False):  # output may end first
        if a != b:
            break
        n += 1
    return n


def accept_tree(token_ids: Sequence[int], parents: Sequence[int], output: list[int], pos: int) -> tuple[int, int]:
    """Longest root path of a draft tree equal to ``output[pos:]``.

    Returns ``(accepted, drafted)``; ``drafted`` counts the tokens of the shortest
    linear draft with the same outcome: the accepted path, plus the next node
    below it when the tree has one. Siblings carry distinct tokens, so the
    matching path is unique and can be walked down through a (parent, token) map.
    """
    child = dict(zip(zip(parents, token_ids, strict=True), range(len(token_ids)), strict=True))
    node, accepted, end = -1, 0, len(output)
    while pos + accepted < end:
        nxt = child.get((node, output[pos + accepted]))
        if nxt is None:
            break
        node = nxt
        accepted += 1
    continues = node in parents  # is there a node below the deepest match?
    return accepted, accepted + (1 if continues else 0)


def replay_call(
    proposer: Proposer,
    spec: CallSpec,
    prompt: np.ndarray,
    output: np.ndarray,
    output_list: list[int],
    tally: Tally,
    context: np.ndarray | None = None,
    seeds: Sequence[TokenSeed] = (),
) -> None:
    """Decode one call again with ``proposer`` drafting; add the counts to ``tally``.

    ``context`` is prompt + output in one buffer (built here if not given): the
    context at any step is a prefix view of it, so no step copies tokens.
    """
    call = CallStepper(proposer, spec, prompt, output, output_list, context, seeds)
    while call.step():
        pass
    call.finish(tally)


class CallStepper:
    """One call decoded again a step at a time (:func:`replay_call` in steps), so that
    calls in flight can take their steps in turn, as a server's batch does.

    Construction is the prefill: the call starts in the proposer with its prompt and
    first output token. :meth:`step` is one decoding step (draft, verify, emit) and says
    whether another follows; :meth:`finish` ends the call and adds its counts to a tally.
    """

    __slots__ = (
        "accepted",
        "cid",
        "context",
        "context_tokens",
        "cut_outcomes",
        "cuts",
        "drafted",
        "index_ns",
        "outcomes",
        "output",
        "output_list",
        "pos",
        "prompt_len",
        "proposals",
        "propose_ns",
        "proposer",
        "steps",
    )

    def __init__(
        self,
        proposer: Proposer,
        spec: CallSpec,
        prompt: np.ndarray,
        output: np.ndarray,
        output_list: list[int],
        context: np.ndarray | None = None,
        seeds: Sequence[TokenSeed] = (),
    ) -> None:
        self.proposer = proposer
        self.cid = spec.call_id
        self.prompt_len = prompt.shape[0]
        self.output = output
        self.output_list = output_list
        self.context = np.concatenate((prompt, output)) if context is None else context
        self.steps = self.drafted = self.accepted = self.proposals = self.context_tokens = 0
        self.propose_ns = 0
        self.pos = 0
        self.outcomes: dict[tuple[int, int], int] = {}
        self.cuts: tuple[float, ...] = getattr(proposer, "cut_probs", ())
        self.cut_outcomes: dict[float, dict[tuple[int, int], int]] = {cut: {} for cut in self.cuts}
        t0 = _now()
        proposer.begin_call(spec, prompt, seeds)
        if output.shape[0]:
            proposer.observe(self.cid, output[:1])  # the prefill step's token
            self.pos = self.steps = 1
        self.index_ns = _now() - t0
        if isinstance(proposer, DraftsWholeCalls):
            t1 = _now()
            proposer.take_output(self.cid, output)
            self.propose_ns += _now() - t1

    def step(self) -> bool:
        """One decoding step, if any is left; whether another follows."""
        n_out = self.output.shape[0]
        pos = self.pos
        if pos >= n_out:
            return False
        p_len = self.prompt_len
        t1 = _now()
        draft: ReplayDraft = self.proposer.propose(self.cid, self.context[: p_len + pos])
        t2 = _now()
        self.propose_ns += t2 - t1
        self.proposals += 1
        toks = draft.token_ids
        if not toks:
            acc = n_draft = 0
        elif draft.parents is None:
            acc = accept_linear(toks, self.output_list, pos)
            n_draft = len(toks)
        else:
            acc, n_draft = accept_tree(toks, draft.parents, self.output_list, pos)
        # The request ends at its last token: a bonus past it is never produced.
        emit = min(acc + 1, n_out - pos)
        acc = min(acc, emit)
        t3 = _now()
        self.proposer.verified(self.cid, n_draft, acc)
        self.proposer.observe(self.cid, self.output[pos : pos + emit])
        self.index_ns += _now() - t3
        self.drafted += n_draft
        self.accepted += acc
        self.outcomes[(n_draft, acc)] = self.outcomes.get((n_draft, acc), 0) + 1
        for cut in self.cuts:
            # Acceptance is a prefix: a draft cut to its first ``kept`` tokens keeps
            # min(acc, kept) of them.
            kept = cut_length(draft.probs[:n_draft], cut) if cut and draft.probs else n_draft
            counts = self.cut_outcomes[cut]
            counts[(kept, min(acc, kept))] = counts.get((kept, min(acc, kept)), 0) + 1
        self.context_tokens += p_len + pos
        self.pos = pos + emit
        self.steps += 1
        return self.pos < n_out

    def finish(self, tally: Tally) -> None:
        """End the call in the proposer; add its counts to ``tally``."""
        t4 = _now()
        self.proposer.end_call(self.cid)
        self.index_ns += _now() - t4
        tally.calls += 1
        tally.prompt_tokens += self.prompt_len
        tally.output_tokens += self.output.shape[0]
        tally.steps += self.steps
        tally.proposals += self.proposals
        tally.drafted_tokens += self.drafted
        tally.accepted_tokens += self.accepted
        tally.index_ns += self.index_ns
        tally.propose_ns += self.propose_ns
        tally.context_tokens += self.context_tokens
        _merge(tally.outcomes, self.outcomes)
        for cut, counts in self.cut_outcomes.items():
            _merge(tally.cut_outcomes.setdefault(cut, {}), counts)


class ClientRouting:
    """Replicas chosen as agentspec's session-aware client chooses backends: the client's own
    :class:`~agentspec.client.routing.PinTable` (rendezvous hashing with bounded load), a
    trajectory counted as one open session of its group from its first call to its last."""

    def __init__(self, replicas: int, remaining: dict[str, int], load_factor: float = 1.25) -> None:
        from agentspec.client.routing import PinTable

        self._names = [f"replica-{r}" for r in range(replicas)]
        self._table = PinTable(load_factor)
        self._remaining = dict(remaining)  # calls left per trajectory
        self._open: set[str] = set()

    @classmethod
    def for_workload(cls, workload: SourceWorkload, replicas: int) -> ClientRouting:
        counts: dict[str, int] = {}
        for trajectory in workload:
            for call in trajectory:
                counts[call.spec.trajectory_id] = counts.get(call.spec.trajectory_id, 0) + 1
        return cls(replicas, counts)

    def route(self, spec: CallSpec) -> int:
        if spec.trajectory_id not in self._open:
            self._open.add(spec.trajectory_id)
            self._table.register(spec.group_id)
        return self._names.index(self._table.resolve(spec.group_id, self._names))

    def done(self, spec: CallSpec) -> None:
        """The call was served: a trajectory's last call closes its session."""
        left = self._remaining.get(spec.trajectory_id, 1) - 1
        self._remaining[spec.trajectory_id] = left
        if left <= 0 and spec.trajectory_id in self._open:
            self._open.discard(spec.trajectory_id)
            self._table.unregister(spec.group_id)


@dataclass
class _Fleet:
    """One proposer's replicas (created on first use) and their routing."""

    make: Callable[[], Proposer]
    routing: Routing
    replicas: int
    exchange: bool = False
    exchange_lag: int = 0
    tally: Tally = field(default_factory=Tally)
    servers: dict[int, Proposer] = field(default_factory=dict)
    client: ClientRouting | None = None  # for Routing.CLIENT
    # Published outputs on their way: (the call number they arrive at, publisher, outputs).
    in_flight: deque[tuple[int, Proposer, list[np.ndarray]]] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if not (self.exchange and self.replicas > 1):
            self.exchange = False
            return
        # Exchanging replicas all run from the start: a late one would miss outputs.
        self.servers = {r: self.make() for r in range(self.replicas)}
        self.exchange = all(isinstance(s, SharesOutputs) for s in self.servers.values())
        if self.exchange:
            for s in self.servers.values():
                s.start_sharing()  # type: ignore[attr-defined]

    def server(self, spec: CallSpec) -> Proposer:
        if self.client is not None:
            r = self.client.route(spec)
        else:
            r = route(spec, self.routing, self.replicas)
        s = self.servers.get(r)
        if s is None:
            s = self.servers[r] = self.make()
        return s

    def exchange_outputs(self, source: Proposer, call: int) -> None:
        """What ``source`` published at call number ``call`` goes to every other replica
        ``exchange_lag`` calls later; the indexing is index time."""
        if not self.exchange:
            return
        outputs = source.take_shared_outputs()  # type: ignore[attr-defined]
        if outputs:
            self.in_flight.append((call + self.exchange_lag, source, outputs))
        while self.in_flight and self.in_flight[0][0] <= call:
            _, publisher, arrived = self.in_flight.popleft()
            t0 = _now()
            for peer in self.servers.values():
                if peer is not publisher:
                    peer.add_peer_outputs(arrived)  # type: ignore[attr-defined]
            self.tally.index_ns += _now() - t0

    def sample_memory(self) -> None:
        total = sum(s.memory_bytes() for s in self.servers.values())
        if total > self.tally.peak_memory_bytes:
            self.tally.peak_memory_bytes = total
            self.tally.held_tokens_at_peak = sum(getattr(s, "held_tokens", lambda: 0)() for s in self.servers.values())


@dataclass(slots=True)
class _Slot:
    """A trajectory in flight under lockstep: its remaining calls and the one decoding."""

    calls: Iterator[ReplayCall]
    call: CallStepper | None = None
    spec: CallSpec | None = None
    server: Proposer | None = None


class _LockstepFleet:
    """One proposer's fleet replaying a workload in lockstep: ``concurrency`` trajectories
    in flight, each round every call in flight takes one decoding step, in slot order, as
    the requests of one server batch do. A trajectory's next call starts in the round after
    its last one ended (an agent waits for the reply); a finished trajectory's slot goes to
    the next one in order."""

    def __init__(self, fleet: _Fleet, workload: SourceWorkload, concurrency: int, memory_every: int) -> None:
        self.fleet = fleet
        self.memory_every = memory_every
        self._pending = iter(workload)
        self.slots: list[_Slot] = []
        for trajectory in self._pending:
            self.slots.append(_Slot(iter(trajectory)))
            if len(self.slots) == concurrency:
                break
        self.finished_calls = 0

    @property
    def done(self) -> bool:
        return not self.slots

    def round(self) -> int:
        """Start calls where slots are free, take one step of every call in flight;
        returns how many calls ended."""
        self.slots = [slot for slot in self.slots if slot.call is not None or self._start(slot)]
        # Each replica's batch: the calls in flight on it (a budget caps their drafts).
        batches: dict[int, tuple[Proposer, int]] = {}
        for slot in self.slots:
            server, n = batches.get(id(slot.server), (slot.server, 0))
            batches[id(slot.server)] = (server, n + 1)  # type: ignore[assignment]
        for server, n in batches.values():
            if isinstance(server, BatchAware):
                server.set_batch_size(n)
        ended = 0
        for slot in self.slots:
            if not slot.call.step():  # type: ignore[union-attr]
                self._finish(slot)
                ended += 1
        return ended

    def _start(self, slot: _Slot) -> bool:
        call = next(slot.calls, None)
        while call is None:
            trajectory = next(self._pending, None)
            if trajectory is None:
                return False
            slot.calls = iter(trajectory)
            call = next(slot.calls, None)
        prompt = np.ascontiguousarray(call.prompt(), dtype=np.int32)
        output = np.ascontiguousarray(call.output(), dtype=np.int32)
        slot.spec = call.spec
        slot.server = self.fleet.server(call.spec)
        slot.call = CallStepper(slot.server, call.spec, prompt, output, output.tolist(), None, call.seeds())
        return True

    def _finish(self, slot: _Slot) -> None:
        fleet = self.fleet
        slot.call.finish(fleet.tally)  # type: ignore[union-attr]
        self.finished_calls += 1
        fleet.exchange_outputs(slot.server, self.finished_calls)  # type: ignore[arg-type]
        if fleet.client is not None:
            fleet.client.done(slot.spec)  # type: ignore[arg-type]
        if self.finished_calls % self.memory_every == 0:
            fleet.sample_memory()
        slot.call = slot.spec = slot.server = None


def replay_source(
    source: str,
    workload: SourceWorkload,
    proposers: dict[str, Callable[[], Proposer]],
    routing: dict[str, Routing],
    replicas: int = 1,
    concurrency: int = 8,
    memory_every: int = 256,
    on_call: Callable[[], None] | None = None,
    exchange: bool = False,
    exchange_lag: int = 0,
    lockstep: bool = False,
) -> SourceResult:
    """Replay one source's workload through every proposer, on fresh servers.

    Each call's token arrays are built once and replayed through each proposer in
    turn; the proposers share nothing. With ``lockstep``, the ``concurrency`` calls in
    flight decode a step each in turn (:class:`_LockstepFleet`) instead of one whole
    call after another, so calls in flight draft from each other's partial outputs, as
    on a server; progress (``on_call``) then follows the first proposer.
    """
    start = time.perf_counter()
    fleets = {
        name: _Fleet(make, routing.get(name, Routing.SPREAD), replicas, exchange, exchange_lag)
        for name, make in proposers.items()
    }
    for fleet in fleets.values():
        if fleet.routing is Routing.CLIENT and replicas > 1:
            fleet.client = ClientRouting.for_workload(workload, replicas)
    if lockstep:
        runs = [_LockstepFleet(f, workload, concurrency, memory_every) for f in fleets.values()]
        while not all(run.done for run in runs):
            for k, run in enumerate(runs):
                ended = 0 if run.done else run.round()
                if k == 0 and on_call is not None:
                    for _ in range(ended):
                        on_call()
        return _source_result(source, workload, fleets, start)
    for n, call in enumerate(interleave(workload, concurrency), 1):
        spec = call.spec
        prompt = np.ascontiguousarray(call.prompt(), dtype=np.int32)
        output = np.ascontiguousarray(call.output(), dtype=np.int32)
        output_list = output.tolist()
        context = np.concatenate((prompt, output))
        seeds = call.seeds()
        for fleet in fleets.values():
            server = fleet.server(spec)
            replay_call(server, spec, prompt, output, output_list, fleet.tally, context, seeds)
            fleet.exchange_outputs(server, n)
            if fleet.client is not None:
                fleet.client.done(spec)
        if n % memory_every == 0:
            for fleet in fleets.values():
                fleet.sample_memory()
        if on_call is not None:
            on_call()
    return _source_result(source, workload, fleets, start)


def _source_result(source: str, workload: SourceWorkload, fleets: dict[str, _Fleet], start: float) -> SourceResult:
    for fleet in fleets.values():
        fleet.sample_memory()
        for server in fleet.servers.values():
            if isinstance(server, CountsSteps):
                for key, n in server.counters().items():
                    fleet.tally.counters[key] = fleet.tally.counters.get(key, 0) + n
    return SourceResult(
        source=source,
        trajectories=len(workload),
        tallies={name: f.tally for name, f in fleets.items()},
        wall_s=time.perf_counter() - start,
    )
