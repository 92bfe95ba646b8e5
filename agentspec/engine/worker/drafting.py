"""Drafting from agentspec's session draft index, as vLLM's proposers call it each step.

:class:`SuffixDrafting` is what :class:`agentspec.engine.vllm.proposers.AgentspecProposer`
adds to vLLM's ``SuffixDecodingProposer`` (the plugin substitutes it; see
:mod:`agentspec.engine.vllm.runner`), so vLLM drives it exactly as it drives its own
suffix method: same call, same verification, same scheduling. What differs:

- it knows each request's session and group (from ``SamplingParams.extra_args``, which the
  middleware fills from every form of session id on the wire) and applies its seeds
  before the first draft;
- it is told when a request finishes or is aborted (:meth:`on_requests_finished`, called
  from the model runner's own bookkeeping) instead of guessing from absence in the batch,
  which would also fire for requests that are merely preempted or not scheduled this step;
- the prompt of a session's next call is indexed incrementally (only the new tail);
- the draft budget shrinks with the batch (:mod:`agentspec.draft_budget.batch_budget`);
- it publishes statistics for the API server (:mod:`agentspec.engine.snapshots`);
- with ``exchange_dir`` or ``exchange_url`` set, it shares finished outputs with the other
  replicas of the model and indexes theirs into its global corpus
  (:mod:`agentspec.engine.exchange`: a folder, or a Redis stream).

All of this but the drafting itself is :class:`SessionDrafting`'s, which the hybrid
(:mod:`agentspec.engine.worker.hybrid_drafting`, the index beside a draft model) shares.

Everything it does with a request (seeds, clipping at the stop, verification records,
budget) is :class:`agentspec.driver.RequestDriver`'s, which the replay benchmark runs too;
these classes only translate vLLM's calls. This module imports no vLLM: it reads vLLM's
objects (the config, the input batch, sampling parameters) by the attributes listed in
:mod:`agentspec.engine.vllm.surface`, and the vLLM subclasses live in
:mod:`agentspec.engine.vllm.proposers`.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, ClassVar

from agentspec import wire
from agentspec._extras import missing_message
from agentspec.draft_budget.batch_budget import BatchBudget, DraftBudget
from agentspec.draft_budget.cost_budget import CostBudget
from agentspec.draft_budget.speed_budget import SpeedBudget
from agentspec.draft_budget.speed_model import parse_speed_model
from agentspec.draft_budget.step_cost import FLAT_PROFILE, read_cost_profile
from agentspec.driver import RequestDriver, RequestSpec, TokenSeed
from agentspec.engine.exchange import (
    Exchange,
    PeerOutput,
    close_at_exit,
    model_fingerprint,
    open_exchange,
)
from agentspec.engine.exchange_config import redacted
from agentspec.engine.settings import EngineSettings, load_settings
from agentspec.engine.snapshots import SnapshotWriter
from agentspec.engine.tenancy import SHARED_TENANT
from agentspec.engine.worker.step_log import StepLog, step_log_path
from agentspec.errors import DraftIndexError
from agentspec.index import DraftIndex

if TYPE_CHECKING:
    from vllm.config.vllm import VllmConfig

# Under vLLM's logger so the lines appear in the server log with vLLM's formatting
# (vLLM configures only the "vllm" logger hierarchy).
logger = logging.getLogger("vllm.agentspec.proposer")


def data_parallel_index(parallel_config: Any) -> int:
    """This engine's data-parallel rank, as the deployment numbers it.

    vLLM runs the data-parallel engines of a dense model as independent DP=1 engines and
    resets their ``data_parallel_rank`` to 0 (``reconfigure_for_independent_dp_rank``);
    ``data_parallel_index`` keeps the original rank. Statistics files, step logs, the
    ``engine`` label and exchange replica ids are named by it, so that engines do not collide.
    """
    for name in ("data_parallel_index", "data_parallel_rank"):
        value = getattr(parallel_config, name, None)
        if value is not None:
            return int(value)
    return 0


class SessionDrafting:
    """What every agentspec proposer does besides proposing: it learns requests' sessions
    and seeds, indexes their text, releases them when vLLM says they finished, exchanges
    outputs with peer replicas and publishes statistics. The plugin calls these methods
    (:meth:`bind`, :meth:`on_request_added`, :meth:`on_requests_finished`,
    :meth:`on_step_end`); a proposer class mixes this in beside the vLLM proposer whose
    place it takes, and calls :meth:`_init_session_drafting` from its constructor.
    """

    #: Whether every rank of a tensor-parallel group must draft alike. vLLM uses rank 0's
    #: drafts only, so ranks that differ merely waste work, unless the drafter runs forward
    #: passes: those hold collectives, and ranks that run different numbers of them hang.
    ranks_must_agree: ClassVar[bool] = False

    def _init_session_drafting(self, vllm_config: VllmConfig, settings: EngineSettings | None = None) -> None:
        spec = vllm_config.speculative_config
        if spec is None:
            raise ValueError(f"{type(self).__name__} needs a speculative config")
        self.settings = settings or load_settings()
        self.num_speculative_tokens: int = spec.num_speculative_tokens
        # The labels vLLM's own series carry, for ours (see agentspec.engine.api_server.prometheus).
        self.model_name = str(vllm_config.model_config.served_model_name)
        # Replicas exchange outputs only with replicas of the same model and tokenizer. The
        # tokenizer's digest is taken at start, and only for the exchange.
        self.model_fingerprint = (
            model_fingerprint(vllm_config.model_config)
            if self.settings.exchange_dir or self.settings.exchange_url
            else f"{self.model_name}:{vllm_config.model_config.get_vocab_size()}"
        )
        self.engine_index = str(data_parallel_index(vllm_config.parallel_config))
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
        # Whether the drafter's measured time feeds the budget (see bind); until bound, as
        # if the worker shared its group.
        self._clock_steers = not self.ranks_must_agree
        self.driver = RequestDriver(self.index, self._make_budget(spec.num_speculative_tokens))
        self._writer: SnapshotWriter | None = None
        self._dirty = False
        self._next_publish = 0.0
        self._exchange: Exchange | None = None
        self._exchange_counters: dict[str, float] = {}  # the transport's, as last polled
        self._next_poll = 0.0
        # Peers' outputs taken from the transport, not yet indexed (see poll_exchange).
        self._peer_backlog: deque[tuple[str, PeerOutput]] = deque()
        self._step_log: StepLog | None = None
        # Per request: its tokens (prompt and output) the index has been given.
        self._seen: dict[str, int] = {}
        # The last step's draft width per request and when its drafting ended: the next
        # step verifies those drafts, and its time is the target's (see _time_step).
        self._step_widths: dict[str, int] = {}
        self._step_ended: float | None = None
        self._next_cost_write = 0.0

    def _make_budget(self, k: int) -> DraftBudget:
        """The draft budget the settings name (``draft_budget``, ``speed_model``)."""
        settings = self.settings
        if settings.speed_model is not None:
            # Caps from a speed model of this engine (agentspec.draft_budget.speed_budget).
            return SpeedBudget(parse_speed_model(settings.speed_model), k)
        if settings.draft_budget == "batch":
            return BatchBudget(k, settings.full_draft_batch, settings.no_draft_batch)
        path = self._cost_profile_path()
        prior = read_cost_profile(path) if path is not None and os.path.exists(path) else FLAT_PROFILE
        if prior is not FLAT_PROFILE:
            logger.info("agentspec: step cost from %s (%s, %d steps)", path, prior.source, prior.steps)
        return CostBudget(k, prior, learns=self._clock_steers)

    def _cost_profile_path(self) -> str | None:
        """Where this worker reads and writes its step cost: the settings' file, with the
        data-parallel rank beside its name past rank 0 (engines do not share one file)."""
        path = self.settings.cost_profile
        if path is None or self.engine_index == "0":
            return path
        root, ext = os.path.splitext(path)
        return f"{root}-dp{self.engine_index}{ext}"

    # ------------------------------------------------------------------ lifecycle (runner)

    def bind(self, *, publish: bool, worker_name: str = "proposer-dp0", alone_in_group: bool = False) -> None:
        """Called once by the plugin with facts only the runner knows.

        ``publish``: whether this worker publishes statistics (one per tensor-parallel
        group: the ranks draft identically, counting them all would double every number).
        ``worker_name`` is unique within the server. ``alone_in_group``: whether this
        worker is alone in its tensor- and pipeline-parallel groups. Otherwise each rank
        decides its drafts alone, so nothing rank-local may steer them: the corpus exchange
        is off (ranks that poll at their own times would index different text) and, where
        the ranks must agree (:attr:`ranks_must_agree`), the drafter's measured time does
        not feed the budget (each rank's clock differs).
        """
        self._clock_steers = alone_in_group or not self.ranks_must_agree
        if isinstance(self.driver.budget, CostBudget):
            self.driver.budget.learns = self._clock_steers
        if not self._clock_steers and not isinstance(self.driver.budget, BatchBudget):
            logger.info(
                "agentspec: the drafter's measured time does not steer the draft budget: this worker"
                " shares its tensor- or pipeline-parallel group, whose ranks must run the same drafter passes"
            )
        if publish and self.settings.state_dir:
            self._writer = SnapshotWriter(self.settings.state_dir, f"{worker_name}.json")
            self._dirty = True
            self.publish(force=True)
            if self.settings.step_log_dir:
                self._step_log = StepLog(step_log_path(self.settings.step_log_dir, worker_name))
                logger.info("agentspec: logging every drafting step to %s", self._step_log.path)
                self._step_log.started(self.num_speculative_tokens, self.max_model_len, self.driver.calibrated_cut)
        if self.settings.exchange_dir or self.settings.exchange_url:
            if not alone_in_group:
                logger.warning("agentspec: corpus exchange is off: it needs tensor- and pipeline-parallel size 1")
            elif self.index.config.global_max_tokens == 0:
                logger.warning("agentspec: corpus exchange is off: the global corpus is off (global_max_tokens=0)")
            else:
                base = self.settings.replica_id or f"{socket.gethostname()}-{os.getpid()}"
                replica = f"{base}-{worker_name.removeprefix('proposer-')}"
                where = self.settings.exchange_dir or redacted(self.settings.exchange_url or "")
                try:
                    self._exchange = open_exchange(
                        exchange_dir=self.settings.exchange_dir,
                        exchange_url=self.settings.exchange_url,
                        replica_id=replica,
                        model=self.model_fingerprint,
                    )
                except ImportError as exc:  # agentspec serve checks this; a plain vLLM start may not
                    logger.error(
                        "agentspec: corpus exchange through %s is off: %s", where, missing_message("redis") or exc
                    )
                    return
                if self._exchange is not None:
                    # Sends what is still queued when the engine's process exits (bounded).
                    close_at_exit(self, self._exchange)
                logger.info(
                    "agentspec: exchanging outputs through %s as replica %s (model %s)",
                    where,
                    replica,
                    self.model_fingerprint,
                )

    def close_exchange(self, timeout: float = 2.0) -> None:
        """Send what the exchange still has queued (``timeout`` seconds at most) and close
        it; the engine drafts on from its own text. For the engine's shutdown; idempotent."""
        exchange, self._exchange = self._exchange, None
        if exchange is not None:
            exchange.close(timeout)

    def on_request_added(self, req_id: str, sampling_params: Any) -> None:
        """A request reached the worker: note its session, group and stop conditions
        (from its ``SamplingParams``), and apply its seeds."""
        if req_id in self.driver:
            return  # a streaming-input update of a running request: keep its state
        self._dirty = True
        args: Mapping[str, Any] = getattr(sampling_params, "extra_args", None) or {}
        if not self._admitted(args):
            # It reached vLLM by a route the middleware does not see (e.g. vLLM's
            # /inference/v1/generate): whatever agentspec keys it carries are the caller's
            # own, so it runs without agentspec (no session, seeds or drafts).
            self.driver.disable(req_id)
            self._count("unadmitted_requests_total")
            return
        max_tokens, stops = None, frozenset[int]()
        if sampling_params is not None:
            max_tokens = sampling_params.max_tokens
            eos = sampling_params.eos_token_id
            stops = frozenset(set(sampling_params.stop_token_ids or ()) | ({eos} if eos is not None else set()))
        tenant = args.get(wire.XARG_TENANT)
        spec = RequestSpec(
            session_id=_as_id(args.get(wire.XARG_SESSION)),
            group_id=_as_id(args.get(wire.XARG_GROUP)),
            # Set by the middleware after authentication (never by the caller); absent for
            # in-process engines, whose caller is the operator.
            tenant=SHARED_TENANT if self.settings.share_across_tenants or not isinstance(tenant, str) else tenant,
            seeds=_seeds(req_id, args.get(wire.XARG_SEEDS)),
            max_tokens=max_tokens,
            stop_ids=stops,
            seed_only=bool(args.get(wire.XARG_SEED_ONLY)),
            policy_version=_as_version(args.get(wire.XARG_POLICY_VERSION)),
            keep_old_outputs=bool(args.get(wire.XARG_KEEP_OLD_OUTPUTS)),
        )
        # Seeds go in now, before the request's first draft (and before it is even prefilled).
        outcome = self.driver.admit(req_id, spec)
        if self._step_log is not None:
            self._step_log.added(req_id, spec.session_id, spec.group_id, max_tokens, stops)
        for seed, reason in outcome.refused:
            logger.warning("seed refused for request %s (%s): %s", req_id, seed.scope.value, reason)

    def _admitted(self, args: Mapping[str, Any]) -> bool:
        """Whether the middleware admitted the request (always, without an admission token)."""
        token = self.settings.admission_token
        stamp = args.get(wire.XARG_ADMISSION)
        return token is None or (isinstance(stamp, str) and hmac.compare_digest(stamp, token))

    def on_requests_finished(self, req_ids: Iterable[str]) -> None:
        """Requests that finished or were aborted, as the scheduler reports them."""
        req_ids = list(req_ids)
        if self._step_log is not None:
            self._step_log.finished(req_ids)
        for req_id in req_ids:
            self._seen.pop(req_id, None)
            # A release changes the counters and gauges even when nothing is drafted
            # afterwards: the engine may go idle on this very step.
            self._dirty = True
            spec, version = self.driver.spec(req_id), self.driver.request_policy_version(req_id)
            out = self.driver.release(req_id, share=self._exchange is not None)
            if out is None or not len(out) or self._exchange is None or spec is None:
                continue
            if self._exchange.publish(out, spec.tenant, version, spec.group_id):
                self._count("exchange_published_total")

    def on_step_end(self, idle: bool) -> None:
        """After the runner's bookkeeping: take in the other replicas' outputs, and
        publish statistics (now if the engine has gone idle)."""
        if idle:
            self._step_ended = None  # the wait for the next request is no step's time
        self.poll_exchange()
        self.publish(force=idle)
        self._write_cost_profile(force=idle)

    def poll_exchange(self) -> None:
        """Index the outputs other replicas published: taken from the transport at most
        every ``exchange_interval_s``, indexed for at most ``exchange_step_budget_s`` per step.

        A catch-up (a restart, the end of an outage) can bring thousands of outputs at
        once; indexing them in one step would stall every request in the batch for about
        a second, so the backlog is spread over the next steps (at least one output each).
        """
        if self._exchange is None:
            return
        now = time.monotonic()
        polled = not self._peer_backlog and now >= self._next_poll
        if polled:
            # The transport's own queue (bounded, oldest dropped) holds what waits meanwhile.
            self._next_poll = now + self.settings.exchange_interval_s
            self._peer_backlog.extend(self._exchange.poll())
        elif not self._peer_backlog:
            return
        indexed = self._index_peer_outputs(now + self.settings.exchange_step_budget_s) if self._peer_backlog else 0
        transport = self._exchange.counters()
        if indexed or transport != self._exchange_counters:
            self._exchange_counters = transport
            self._dirty = True

    def _index_peer_outputs(self, deadline: float) -> int:
        """Index backlogged peer outputs until ``deadline`` (one at least); how many were taken."""
        backlog, taken, shared = self._peer_backlog, 0, self.settings.share_across_tenants
        while backlog:
            tenant, output = backlog.popleft()
            taken += 1
            if not self.driver.is_draftable_version(output.policy_version):
                # Generated under a policy this server has retired (the peer may not have
                # heard of the update yet, or published just before it).
                self._count("exchange_retired_total")
            else:
                try:
                    n = self.index.add_peer_output(output.tokens, tenant=SHARED_TENANT if shared else tenant)
                except DraftIndexError as exc:  # a peer's text is never worth failing the engine
                    logger.warning("agentspec: ignoring a peer output: %s", exc)
                else:
                    self._count("exchange_received_total")
                    self._count("exchange_received_tokens_total", n)
            if time.monotonic() >= deadline:
                break
        return taken

    def catch_up_finished(self, req_id: str, num_prompt_tokens: int, output_token_ids: Sequence[int]) -> None:
        """Before :meth:`on_requests_finished`: index what the request produced on steps
        this proposer did not see (all its last ones, when it ran into the context limit),
        from the runner's record of it (its prompt length and output tokens)."""
        seen = self._seen.get(req_id)
        if seen is None or seen < num_prompt_tokens or seen >= num_prompt_tokens + len(output_token_ids):
            return
        try:
            self._take_missed(req_id, list(output_token_ids[seen - num_prompt_tokens :]))
        except DraftIndexError as exc:  # never fail the engine over indexing
            logger.warning("request %s: could not index its last tokens: %s", req_id, exc)

    # ------------------------------------------------------------------ drafting, shared

    def _catch_up(self, input_batch: Any, i: int, req_id: str, before: int) -> None:
        """Index tokens of steps this proposer did not see: vLLM skips the drafter for a
        whole step when a request nears the context window (``_input_fits_in_drafter``).
        ``before``: how many of row ``i``'s tokens precede this step's."""
        seen = self._seen.get(req_id)
        if seen is not None and seen < before:
            self._take_missed(req_id, input_batch.token_ids_cpu[i, seen:before].tolist())

    def _take_missed(self, req_id: str, missed: list[int]) -> None:
        """Index ``missed``, the request's tokens of steps the proposer did not see. What
        was verified then is unknown, so its last draft is settled as unverified."""
        self.driver.withdraw(req_id)
        self.driver.advance(req_id, missed)
        self._count("drafter_missed_steps_total")
        self._dirty = True

    def _begin_or_settle(self, input_batch: Any, i: int, req_id: str, sampled: list[int], num_tokens: int) -> None:
        """Bring the index up to date with request ``req_id`` (row ``i``), whose
        ``num_tokens`` tokens so far end with this step's ``sampled`` ones: start its call
        if it is new, else record how much of its last draft the target accepted."""
        driver = self.driver
        if not driver.begun(req_id):
            num_prompt = int(input_batch.num_prompt_tokens[i])
            row = input_batch.token_ids_cpu[i]
            before = num_tokens - len(sampled)
            # Everything generated so far: normally the first sampled token; more if the
            # request is first seen late (e.g. resumed).
            driver.begin(req_id, row[:num_prompt], [*row[num_prompt:before].tolist(), *sampled])
        else:
            # vLLM returns the accepted draft tokens plus one sampled token.
            driver.verified(req_id, len(sampled) - 1, sampled)
            driver.advance(req_id, sampled)

    def _time_step(self, req_ids: Sequence[str], sampled_rows: Sequence[Sequence[int]], started: float) -> None:
        """Tell the budget what the step that just ran verified, emitted and took.

        Its time is from the end of the last step's drafting to the start of this one's:
        the target's forward pass over the last drafts, sampling and the scheduler. A step
        with a row the last step did not draft for (a prefill, a resumed request) is not a
        decoding step and teaches nothing; nor does the first step after the engine idled.
        The time is given only where the clock may steer (see :meth:`bind`)."""
        ended, self._step_ended = self._step_ended, None
        widths = self._step_widths
        batch = verified = emitted = 0
        for req_id, sampled in zip(req_ids, sampled_rows, strict=False):
            width = widths.get(req_id)
            if width is None or not sampled:
                return
            batch += 1
            verified += 1 + width
            emitted += len(sampled)
        seconds = started - ended if ended is not None and self._clock_steers else None
        if self.driver.budget is not None and batch:
            self.driver.budget.observe_timed_step(batch, verified, emitted, seconds)

    def _end_step(self, req_ids: Sequence[str], drafts: Sequence[Sequence[int]]) -> None:
        """Remember the step's drafts (what the next step verifies) and when drafting ended."""
        self._step_widths = {req_id: len(d) for req_id, d in zip(req_ids, drafts, strict=False)}
        budget = self.driver.budget
        if isinstance(budget, CostBudget):
            cost = budget.cost
            counters = self.driver.counters
            counters["cost_fixed_seconds"] = cost.fixed_s
            counters["cost_per_request_seconds"] = cost.per_request_s
            counters["cost_per_token_seconds"] = cost.per_token_s
            counters["cost_drafter_pass_seconds"] = cost.drafter_pass_s
            counters["cost_timed_steps"] = cost.steps
            counters["draft_token_price"] = budget.last_price
        self._step_ended = perf_counter()

    def _write_cost_profile(self, force: bool = False) -> None:
        """Keep the settings' cost profile file up to date (at most every 5 s while busy)."""
        budget, path = self.driver.budget, self._cost_profile_path()
        if path is None or not isinstance(budget, CostBudget) or not budget.learns:
            return
        now = time.monotonic()
        if not budget.estimator.steps or (not force and now < self._next_cost_write):
            return
        self._next_cost_write = now + _COST_WRITE_INTERVAL_S
        try:
            budget.cost.write(path)
        except OSError as exc:  # a full disk must not take the engine down
            logger.warning("agentspec: cannot write the cost profile %s: %s", path, exc)

    def _end_propose(self, input_batch: Any, rows: int, started: float, budget: int) -> None:
        """After a step's drafts: feed the budget what the step cost, publish statistics.

        The drafter's time is fed only where the clock may steer (see :meth:`bind`);
        elsewhere it is fed as nothing, so that the budget decides from what every rank
        sees alike: batch sizes, contexts and the target's verdicts."""
        if self.driver.budget is not None and rows:
            self.driver.budget.observe_step(
                rows,
                float(input_batch.num_tokens_no_spec[:rows].sum()) / rows,
                (perf_counter() - started) / rows if self._clock_steers else 0.0,
                budget > 0,
            )
        self._dirty = True
        self.publish()

    # ------------------------------------------------------------------ statistics

    def _count(self, key: str, n: float = 1) -> None:
        self.driver.counters[key] = self.driver.counters.get(key, 0) + n

    def snapshot(self) -> dict[str, Any]:
        """Counters, index statistics and per-session stats (see :mod:`.metrics`)."""
        sessions: dict[str, dict[str, Any]] = {}  # tenant -> session id -> stats
        for tenant, sid in self.driver.recent_sessions():
            stats = self.index.session_stats(sid, tenant)
            if stats is not None:
                sessions.setdefault(tenant, {})[sid] = dataclasses.asdict(stats)
        return {
            "model_name": self.model_name,
            "engine_index": self.engine_index,
            "engine": {**self.driver.counters, **self._exchange_counters},
            "distributions": {k: {str(v): n for v, n in c.items()} for k, c in self.driver.distributions.items()},
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


class SuffixDrafting(SessionDrafting):
    """Drafts from the session draft index alone, with the interface of vLLM's suffix
    proposer (``propose``): :class:`agentspec.engine.vllm.proposers.AgentspecProposer`
    mixes this in before ``SuffixDecodingProposer``."""

    # ------------------------------------------------------------------ vLLM's proposer interface

    def propose(  # type: ignore[override]
        self,
        num_speculative_tokens: int,
        input_batch: Any,
        sampled_token_ids: list[list[int]],
        slot_mappings: Any = None,  # unused, as in vLLM's suffix proposer
    ) -> list[list[int]]:
        """Draft for every request in the batch (``[]`` where there is nothing to draft)."""
        started = perf_counter()
        self._time_step(input_batch.req_ids, sampled_token_ids, started)
        budget = self.driver.budget_for(len(sampled_token_ids), num_speculative_tokens)
        drafts: list[list[int]] = []
        rows: list[tuple[str, int, int, int]] | None = [] if self._step_log is not None else None
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a partial prefill: nothing sampled, nothing to draft
                drafts.append([])
                continue
            req_id = input_batch.req_ids[i]
            # Called after the runner's bookkeeping: the row holds this step's tokens.
            num_tokens = int(input_batch.num_tokens_no_spec[i])
            cap = min(budget, self.max_model_len - num_tokens - 1)
            try:
                self._catch_up(input_batch, i, req_id, num_tokens - len(sampled))
                self._begin_or_settle(input_batch, i, req_id, sampled, num_tokens)
                self._seen[req_id] = num_tokens
                draft = self.driver.draft(req_id, cap)
            except DraftIndexError as exc:
                # Never fail the engine over drafting: this request runs unspeculated.
                logger.warning("request %s: drafting disabled: %s", req_id, exc)
                self.driver.disable(req_id)
                draft = None
            drafts.append(draft.token_ids if draft is not None else [])
            if rows is not None:
                rows.append((req_id, len(sampled), cap, len(drafts[-1])))
        if self._step_log is not None and rows is not None:
            self._step_log.step(len(sampled_token_ids), rows, self.driver.min_prob)
        self._end_propose(input_batch, len(drafts), started, budget)
        self._end_step(input_batch.req_ids, drafts)
        return drafts


#: A busy engine waits this many times a snapshot's cost before writing the next one.
_PUBLISH_COST_FACTOR = 20
#: Least seconds between two writes of the cost profile file while busy.
_COST_WRITE_INTERVAL_S = 5.0


def _as_id(value: Any) -> str | None:
    """An id from ``extra_args``; the middleware has validated it (non-empty string)."""
    return value if isinstance(value, str) and value else None


def _as_version(value: Any) -> int | None:
    """A policy version from ``extra_args`` (set only by the middleware's policy request)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _seeds(req_id: str, raw: Any) -> tuple[TokenSeed, ...]:
    """The seeds the middleware put into ``extra_args`` (a JSON list of token-id seeds)."""
    if not raw:
        return ()
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
        return tuple(
            TokenSeed(
                tuple(int(t) for t in item.get("token_ids", ())),
                wire.SeedScope(item.get("scope", wire.SeedScope.SESSION)),
                wire.SeedKind(item.get("kind", wire.SeedKind.PRIOR_TURN)),
            )
            for item in items
            if isinstance(item, dict)
        )
    except (TypeError, ValueError):
        logger.warning("request %s: ignoring malformed %s", req_id, wire.XARG_SEEDS)
        return ()
