"""Redo a server's drafting steps offline, from its step log and its calls' token ids.

The replay benchmark (:mod:`agentspec.replay.simulate`) decodes one call at a time with no
batch budget. A busy server differs in two ways: the batch budget cuts drafts, and calls
that run at once see each other's text as it is generated (siblings of a group, the
tenant's global corpus). :func:`replay_steps` removes both differences: it takes the
server's step log (:mod:`agentspec.engine.worker.step_log`) and the prompt and output token ids
of the logged requests, and drives the same :class:`~agentspec.driver.RequestDriver` over
a fresh :class:`~agentspec.index.DraftIndex` through the same events in the same order
(requests added, steps with their rows in batch order and their caps, requests finished).
Acceptance is computed from the recorded outputs, as in the benchmark (greedy decoding).

Every step is checked against the log: the tokens the target emitted for each request and
the length of its draft must be what the server logged. With the server's index settings
and a tenant whose text the replay holds in full, nothing may differ
(``StepReplay.mismatches`` is empty); the first difference says where the benchmark and
the engine part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentspec.driver import RequestDriver, RequestSpec
from agentspec.index import DraftIndex
from agentspec.replay.simulate import accept_linear


@dataclass(frozen=True)
class LoggedCall:
    """The token ids of one logged request, from the client's transcript."""

    prompt: Sequence[int]
    output: Sequence[int]


@dataclass(frozen=True)
class StepMismatch:
    """A step where the replay and the server parted."""

    step: int
    req_id: str
    what: str  # "emitted" or "drafted"
    server: int
    replay: int


@dataclass
class StepReplay:
    """What :func:`replay_steps` found."""

    index: DraftIndex
    steps: int = 0
    rows: int = 0
    #: Rows whose cap was below the server's ``num_speculative_tokens`` (the batch budget,
    #: or the context's end, cut them).
    limited_rows: int = 0
    max_batch: int = 0
    mismatches: list[StepMismatch] = field(default_factory=list)

    def session_totals(self, session_id: str) -> tuple[int, int]:
        """``(drafted, accepted)`` tokens of a session in the replay's index."""
        stats = self.index.session_stats(session_id)
        return (0, 0) if stats is None else (stats.drafted_tokens, stats.accepted_tokens)


@dataclass
class _Live:
    prompt: np.ndarray
    output: list[int]
    pos: int = 0
    draft: list[int] = field(default_factory=list)


def requests_by_session(events: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Logged request ids per session, in arrival order. A session's calls run one after
    another, so the n-th request of a session is the client's n-th call of it."""
    out: dict[str, list[str]] = {}
    for event in events:
        if event.get("e") == "add" and event.get("session") is not None:
            out.setdefault(event["session"], []).append(event["req"])
    return out


def replay_steps(events: Sequence[Mapping[str, Any]], calls: Mapping[str, LoggedCall], index: DraftIndex) -> StepReplay:
    """Redo the logged steps of the requests in ``calls`` (keyed by logged request id) with
    ``index`` (give it the server's :class:`~agentspec.index.policy.IndexConfig`). Rows of other
    requests are skipped: they count only in the batch size, whose effect, the cap, is
    logged per row."""
    driver = RequestDriver(index)
    result = StepReplay(index)
    live: dict[str, _Live] = {}
    full_cap: int | None = None
    for event in events:
        kind = event.get("e")
        if kind == "start":
            full_cap = int(event["k"])
            driver.calibrated_cut = bool(event.get("calibrated", False))
        elif kind == "end":
            for req_id in event["req"]:
                if live.pop(req_id, None) is not None:
                    driver.release(req_id)
        elif kind == "add" and event["req"] in calls:
            req_id = event["req"]
            call = calls[req_id]
            spec = RequestSpec(
                session_id=event.get("session"),
                group_id=event.get("group"),
                max_tokens=event.get("max_tokens"),
                stop_ids=frozenset(event.get("stops") or ()),
            )
            driver.admit(req_id, spec)
            live[req_id] = _Live(np.asarray(call.prompt, dtype=np.int32), [int(t) for t in call.output])
        elif kind == "step":
            result.steps += 1
            result.max_batch = max(result.max_batch, int(event["batch"]))
            driver.min_prob = float(event.get("min_prob", 0.0))  # the step's probability cut
            for req_id, sampled, cap, drafted in event["rows"]:
                state = live.get(req_id)
                if state is None:
                    continue
                result.rows += 1
                result.limited_rows += full_cap is not None and cap < full_cap
                emitted = _settle(driver, req_id, state)
                # The server's last step may emit past the output's end (vLLM verifies a
                # whole draft; the engine drops what lies past the stop): compare what is kept.
                kept = min(sampled, len(state.output) - (state.pos - emitted))
                if emitted != kept:
                    result.mismatches.append(StepMismatch(result.steps, req_id, "emitted", kept, emitted))
                draft = driver.draft(req_id, cap)
                state.draft = list(draft.token_ids) if draft is not None else []
                if len(state.draft) != drafted:
                    result.mismatches.append(StepMismatch(result.steps, req_id, "drafted", drafted, len(state.draft)))
    return result


def _settle(driver: RequestDriver, req_id: str, state: _Live) -> int:
    """The step's tokens for a request, as the engine's proposer takes them in: its first
    (the prefill's token) starts its call; later ones settle its last draft. Returns how
    many output tokens the step emitted."""
    if not driver.begun(req_id):
        driver.begin(req_id, state.prompt, state.output[:1])
        state.pos = min(1, len(state.output))
        return state.pos
    accepted = accept_linear(state.draft, state.output, state.pos)
    emitted = state.output[state.pos : state.pos + accepted + 1]
    driver.verified(req_id, accepted, emitted)
    driver.advance(req_id, emitted)
    state.pos += len(emitted)
    return len(emitted)
