"""The proposer vLLM calls every step: drafts from agentspec's session draft index.

:class:`AgentspecProposer` takes the place of vLLM's ``SuffixDecodingProposer`` (the
plugin substitutes it; see :mod:`agentspec.engine.plugin`), so vLLM drives it exactly as it
drives its own suffix method: same call, same verification, same scheduling. What differs:

- it knows each request's session and group (from ``SamplingParams.extra_args``, which the
  middleware fills from every form of session id on the wire) and applies its seeds
  before the first draft;
- it is told when a request finishes or is aborted (:meth:`on_requests_finished`, called
  from the model runner's own bookkeeping) instead of guessing from absence in the batch,
  which would also fire for requests that are merely preempted or not scheduled this step;
- the prompt of a session's next call is indexed incrementally (only the new tail);
- the draft budget shrinks with the batch (:mod:`agentspec.engine.budget`);
- it publishes statistics for the API server (:mod:`agentspec.engine.metrics`);
- with ``exchange_dir`` set, it shares finished outputs with the other replicas of the
  model and indexes theirs into its global corpus (:mod:`agentspec.engine.exchange`).

A seam for the hybrid with a model drafter (EAGLE / draft model): :meth:`_draft` returns
the index's :class:`~agentspec.index.Draft` with its score, so a future fallback can pick,
per request, between it and a model drafter's proposal. Not implemented yet.

This module is imported only inside vLLM processes (it subclasses vLLM's proposer).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

from agentspec.engine.budget import BatchBudget
from agentspec.engine.config import XARG_GROUP, XARG_SEEDS, XARG_SESSION, EngineSettings, load_settings
from agentspec.engine.exchange import CorpusExchange
from agentspec.engine.metrics import SnapshotWriter
from agentspec.errors import DraftIndexError
from agentspec.index import Draft, DraftIndex

# Under vLLM's logger so the lines appear in the server log with vLLM's formatting
# (vLLM configures only the "vllm" logger hierarchy).
logger = logging.getLogger("vllm.agentspec.proposer")


@dataclass(slots=True)
class _Request:
    """What the proposer knows of one running request."""

    session_id: str | None
    group_id: str | None
    seeds: list[dict[str, Any]] = field(default_factory=list)
    last_draft_len: int = 0
    disabled: bool = False  # the index refused this request; it runs without speculation
    # What the scheduler's stop check uses, so the index holds exactly the output the
    # client gets: in the step a request finishes, the runner still reports every
    # accepted token, and the scheduler drops those after the stop.
    max_tokens: int | None = None
    stop_ids: frozenset[int] = frozenset()
    output_len: int = 0
    done: bool = False

    def clip(self, tokens: Sequence[int]) -> list[int]:
        """The prefix of newly generated ``tokens`` the scheduler keeps."""
        kept: list[int] = []
        for tok in map(int, tokens):
            if self.done:
                break
            kept.append(tok)
            self.output_len += 1
            if tok in self.stop_ids or (self.max_tokens is not None and self.output_len >= self.max_tokens):
                self.done = True
        return kept


class AgentspecProposer(SuffixDecodingProposer):
    """Session-aware suffix drafting with the interface of vLLM's suffix proposer.

    The parent's constructor is deliberately not called: it builds arctic-inference's
    ``SuffixDecodingCache``, which :class:`~agentspec.index.DraftIndex` replaces.
    """

    def __init__(self, vllm_config: VllmConfig, settings: EngineSettings | None = None) -> None:
        spec = vllm_config.speculative_config
        if spec is None:
            raise ValueError("AgentspecProposer needs a speculative config")
        self.settings = settings or load_settings()
        self.num_speculative_tokens: int = spec.num_speculative_tokens
        self.max_model_len: int = vllm_config.model_config.max_model_len
        # The draft knobs vLLM's suffix method exposes come from --speculative-config, so
        # `vllm serve --speculative-config` and agentspec never disagree about them.
        policy = self.settings.index.policy.model_copy(
            update={
                "max_depth": spec.suffix_decoding_max_tree_depth,
                "max_spec_tokens": spec.num_speculative_tokens,
                "max_spec_factor": spec.suffix_decoding_max_spec_factor,
                "min_token_prob": spec.suffix_decoding_min_token_prob,
            }
        )
        self.index = DraftIndex(self.settings.index.model_copy(update={"policy": policy}))
        self.budget = BatchBudget(
            spec.num_speculative_tokens, self.settings.full_draft_batch, self.settings.no_draft_batch
        )
        self._requests: dict[str, _Request] = {}
        # Sessions seen recently, most recent last; bounded like the index's own LRU.
        self._sessions: OrderedDict[str, None] = OrderedDict()
        self._counters: dict[str, float] = {}
        self._writer: SnapshotWriter | None = None
        self._dirty = False
        self._next_publish = 0.0
        self._exchange: CorpusExchange | None = None
        self._next_poll = 0.0

    # ------------------------------------------------------------------ lifecycle (runner)

    def bind(self, *, publish: bool, worker_name: str = "proposer-dp0", exchange_ok: bool = False) -> None:
        """Called once by the plugin with facts only the runner knows.

        ``publish``: whether this worker publishes statistics (one per tensor-parallel
        group: the ranks draft identically, counting them all would double every number).
        ``worker_name`` is unique within the server. ``exchange_ok``: whether this worker
        is alone in its tensor- and pipeline-parallel groups; the corpus exchange runs only
        then, because ranks that poll at their own times would index different text and
        draft differently.
        """
        if publish and self.settings.state_dir:
            self._writer = SnapshotWriter(self.settings.state_dir, f"{worker_name}.json")
            self._dirty = True
            self.publish(force=True)
        if self.settings.exchange_dir:
            if not exchange_ok:
                logger.warning("agentspec: corpus exchange is off: it needs tensor- and pipeline-parallel size 1")
            elif self.index.config.global_max_tokens == 0:
                logger.warning("agentspec: corpus exchange is off: the global corpus is off (global_max_tokens=0)")
            else:
                name = f"{socket.gethostname()}-{os.getpid()}-{worker_name.removeprefix('proposer-')}"
                self._exchange = CorpusExchange(self.settings.exchange_dir, name)
                logger.info("agentspec: exchanging outputs through %s as %s", self.settings.exchange_dir, name)

    def on_request_added(self, req_id: str, sampling_params: Any) -> None:
        """A request reached the worker: note its session, group and stop conditions
        (from its ``SamplingParams``), and apply its seeds."""
        if req_id in self._requests:
            return  # a streaming-input update of a running request: keep its state
        args: Mapping[str, Any] = getattr(sampling_params, "extra_args", None) or {}
        session_id = _as_id(args.get(XARG_SESSION))
        group_id = _as_id(args.get(XARG_GROUP))
        req = _Request(session_id, group_id)
        if sampling_params is not None:
            req.max_tokens = sampling_params.max_tokens
            eos = sampling_params.eos_token_id
            stops = set(sampling_params.stop_token_ids or ())
            req.stop_ids = frozenset(stops | ({eos} if eos is not None else set()))
        raw_seeds = args.get(XARG_SEEDS)
        if raw_seeds:
            try:
                seeds = json.loads(raw_seeds) if isinstance(raw_seeds, str) else raw_seeds
                req.seeds = [s for s in seeds if isinstance(s, dict)]
            except (TypeError, ValueError):
                logger.warning("request %s: ignoring malformed %s", req_id, XARG_SEEDS)
        self._requests[req_id] = req
        # Seeds go in now, before the request's first draft (and before it is even prefilled).
        self._apply_seeds(req)

    def on_requests_finished(self, req_ids: Iterable[str]) -> None:
        """Requests that finished or were aborted, as the scheduler reports them."""
        released = False
        for req_id in req_ids:
            self._requests.pop(req_id, None)
            if self.index.has_call(req_id):
                if self._exchange is not None:
                    out = self.index.shared_output(req_id)  # gone after finish_call
                    if out is not None and len(out) and self._exchange.publish(out):
                        self._count("exchange_published_total")
                self.index.finish_call(req_id)
                self._count("calls_finished_total")
                released = True
        if released:
            self._dirty = True

    def on_step_end(self, idle: bool) -> None:
        """After the runner's bookkeeping: take in the other replicas' outputs, and
        publish statistics (now if the engine has gone idle)."""
        self.poll_exchange()
        self.publish(force=idle)

    def poll_exchange(self) -> None:
        """Index the outputs other replicas published, at most every ``exchange_interval_s``."""
        if self._exchange is None:
            return
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self.settings.exchange_interval_s
        records = self._exchange.poll()
        for tokens in records:
            try:
                n = self.index.add_peer_output(tokens)
            except DraftIndexError as exc:  # a peer's text is never worth failing the engine
                logger.warning("agentspec: ignoring a peer output: %s", exc)
                continue
            self._count("exchange_received_total")
            self._count("exchange_received_tokens_total", n)
        if records:
            self._dirty = True

    # ------------------------------------------------------------------ vLLM's proposer interface

    def propose(  # type: ignore[override]
        self,
        num_speculative_tokens: int,
        input_batch: Any,
        sampled_token_ids: list[list[int]],
        slot_mappings: Any = None,  # unused, as in vLLM's suffix proposer
    ) -> list[list[int]]:
        """Draft for every request in the batch (``[]`` where there is nothing to draft)."""
        batch_size = len(sampled_token_ids)
        budget = min(self.budget.tokens_for(batch_size), num_speculative_tokens)
        self._counters["draft_budget"] = budget
        self._counters["batch_size"] = batch_size
        if budget < self.num_speculative_tokens:
            self._count("budget_off_steps_total" if budget == 0 else "budget_limited_steps_total")

        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a partial prefill: nothing sampled, nothing to draft
                drafts.append([])
                continue
            req_id = input_batch.req_ids[i]
            num_tokens = int(input_batch.num_tokens_no_spec[i])
            try:
                draft = self._draft(input_batch, i, req_id, sampled, num_tokens, budget)
            except DraftIndexError as exc:
                # Never fail the engine over drafting: this request runs unspeculated.
                logger.warning("request %s: drafting disabled: %s", req_id, exc)
                self._disable(req_id)
                draft = None
            drafts.append(draft.token_ids if draft is not None else [])
        self._dirty = True
        self.publish()
        return drafts

    def _draft(
        self, input_batch: Any, i: int, req_id: str, sampled: list[int], num_tokens: int, budget: int
    ) -> Draft | None:
        req = self._requests.get(req_id)
        if req is None:
            # Not announced by the runner hook (cannot happen with the plugin installed);
            # draft it as vLLM's suffix method would: the call and the global corpus.
            req = self._requests[req_id] = _Request(None, None)
        if req.disabled or req.done:
            return None
        if not self.index.has_call(req_id):
            self._start(input_batch, i, req_id, req, num_tokens)
        else:
            if req.last_draft_len:
                # vLLM returns the accepted draft tokens plus one sampled token.
                accepted = max(0, min(len(sampled) - 1, req.last_draft_len))
                self.index.record_verification(req_id, req.last_draft_len, accepted)
            self.index.extend_call(req_id, req.clip(sampled))
        if req.done:  # finished in this step; vLLM will report it in the next
            req.last_draft_len = 0
            return None
        max_tokens = min(budget, self.max_model_len - num_tokens - 1)
        if max_tokens <= 0:
            req.last_draft_len = 0
            return None
        draft = self.index.propose(req_id, max_tokens)
        req.last_draft_len = len(draft.token_ids)
        return draft

    def _start(self, input_batch: Any, i: int, req_id: str, req: _Request, num_tokens: int) -> None:
        num_prompt = int(input_batch.num_prompt_tokens[i])
        row = input_batch.token_ids_cpu[i]
        start = self.index.start_call(req_id, row[:num_prompt], session_id=req.session_id, group_id=req.group_id)
        # Everything generated so far (normally the first sampled token; more if the
        # request is first seen late, e.g. resumed).
        self.index.extend_call(req_id, req.clip(row[num_prompt:num_tokens].tolist()))
        self._count("calls_started_total")
        self._count("index_new_tokens_total", start.new_tokens)
        self._count("index_reused_tokens_total", start.reused_tokens)
        if req.session_id is not None:
            self._touch_session(req.session_id)

    def _apply_seeds(self, req: _Request) -> None:
        for seed in req.seeds:
            scope = seed.get("scope", "session")
            # A request without a group is its own group: group seeds go to its session.
            target = (req.group_id or req.session_id) if scope == "group" else req.session_id
            if target is None:
                continue  # the middleware refuses this; a direct vllm_xargs user gets no seed
            where = {"group_id": target} if scope == "group" and req.group_id else {"session_id": target}
            try:
                n = self.index.seed(seed.get("token_ids", []), kind=seed.get("kind", "prior_turn"), **where)
            except DraftIndexError as exc:
                logger.warning("seed refused for %s: %s", where, exc)
                self._count("seed_errors_total")
                continue
            self._count("seeded_tokens_total", n)
            if req.session_id is not None:
                self._touch_session(req.session_id)
        req.seeds = []

    def _disable(self, req_id: str) -> None:
        req = self._requests.setdefault(req_id, _Request(None, None))
        req.disabled = True
        if self.index.has_call(req_id):
            self.index.finish_call(req_id)

    # ------------------------------------------------------------------ statistics

    def _count(self, key: str, n: float = 1) -> None:
        self._counters[key] = self._counters.get(key, 0) + n

    def _touch_session(self, session_id: str) -> None:
        self._sessions[session_id] = None
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.index.config.max_sessions:
            self._sessions.popitem(last=False)

    def snapshot(self) -> dict[str, Any]:
        """Counters, index statistics and per-session stats (see :mod:`.metrics`)."""
        sessions: dict[str, Any] = {}
        for sid in list(self._sessions):
            stats = self.index.session_stats(sid)
            if stats is None:  # evicted by the index
                del self._sessions[sid]
                continue
            sessions[sid] = dataclasses.asdict(stats)
        return {
            "engine": dict(self._counters),
            "index": dataclasses.asdict(self.index.stats()),
            "sessions": sessions,
        }

    def publish(self, force: bool = False) -> None:
        """Write a snapshot if something changed, at most every ``publish_interval_s``
        while busy (``force``: now, e.g. when the engine goes idle).

        A snapshot grows with the sessions held, and it is written on the engine's own
        thread: the next one waits at least 20 times as long as this one took, so that
        statistics never take more than about 5% of a busy engine's time.
        """
        if self._writer is None or not self._dirty:
            return
        now = time.monotonic()
        if not force and now < self._next_publish:
            return
        try:
            self._writer.write(self.snapshot())
        except OSError as exc:  # statistics must never take the engine down
            logger.warning("agentspec: cannot publish statistics: %s", exc)
        took = time.monotonic() - now
        self._next_publish = now + max(self.settings.publish_interval_s, _PUBLISH_COST_FACTOR * took)
        self._dirty = False


#: A busy engine waits this many times a snapshot's cost before writing the next one.
_PUBLISH_COST_FACTOR = 20


def _as_id(value: Any) -> str | None:
    """An id from ``extra_args``; the middleware has validated it (non-empty string)."""
    return value if isinstance(value, str) and value else None
