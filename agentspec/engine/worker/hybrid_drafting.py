"""Hybrid drafting in vLLM: the session draft index beside a draft model.

vLLM 0.32's model runner holds one drafter, chosen by ``speculative_config.method``, and
only a ``draft_model`` (or EAGLE) method gets draft weights and a draft KV cache. So
``agentspec serve --agentspec-drafter MODEL`` runs the ``draft_model`` method, and the
plugin substitutes :class:`~agentspec.engine.vllm.proposers.HybridProposer`, a subclass
of vLLM's ``DraftModelProposer`` that also owns the draft index
(:class:`~agentspec.engine.worker.drafting.SessionDrafting`); this module holds its decisions and
imports no vLLM.

Each step, for each request: the index's draft is computed first (free); the request
takes it when its expected accepted tokens are at least the model drafter's (measured
online), else the model drafter's (:mod:`agentspec.draft_budget.drafter_choice`). The draft model's
forward pass is batched, so its cost is cut per step, not per request:

- its first pass always runs: it writes the draft KV cache for the tokens the target
  just verified, whichever drafter proposed them (the pass reads the target's own input
  tokens). That pass is all vLLM's ``propose(num_speculative_tokens=0)`` runs;
- its later, autoregressive passes run only when some request in the step chose the
  model drafter. They write KV entries only for positions past the verified tokens,
  which the next step's first pass overwrites, so skipping them leaves the draft KV
  cache exactly as running them would have (``tests/engine/test_hybrid.py`` checks
  this with a drafter that always agrees with the target: every model draft is accepted
  in full, also after skipped steps).

Drafts go back to vLLM as one list per request, of any length up to the index's longest
(the speculative config's ``num_speculative_tokens``); the drafter drafts
``drafter.num_tokens``. This needs vLLM's synchronous scheduling (``serve`` turns async
scheduling off), as vLLM's own suffix method does. Where vLLM keeps the draft model's
probabilities for rejection sampling (``draft_sample_method: probabilistic`` at
temperature > 0), rows drafted by the index carry one-hot probabilities (their drafts
are deterministic), which keeps the sampling exact; such rows are then as long as the
model's drafts at most.

The plugin hands each step's sampled tokens to :meth:`HybridDrafting.take_step` before
vLLM calls :meth:`HybridDrafting.propose` (vLLM passes the draft model only the last
token of each request).

Under tensor parallelism every rank drafts (vLLM uses rank 0's drafts) and every rank
runs the draft model's passes, which hold collectives: each rank decides alone how many
to run, so each must decide alike. The decision reads only what every rank sees alike
(the batch, the sampled tokens, the index built from them, the target's verdicts); the
drafter's measured time, which differs per rank, does not steer the budget there
(:meth:`~agentspec.engine.worker.drafting.SessionDrafting.bind`).
"""

from __future__ import annotations

import logging
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch

from agentspec.draft_budget.cost_budget import CostBudget
from agentspec.draft_budget.drafter_choice import DraftPath, HybridRule, model_runs, net_tokens, passes_pay
from agentspec.engine.settings import EngineSettings
from agentspec.engine.worker.drafting import SessionDrafting
from agentspec.errors import DraftIndexError
from agentspec.index import Draft

if TYPE_CHECKING:
    from vllm.config.vllm import VllmConfig

logger = logging.getLogger("vllm.agentspec.hybrid")

__all__ = ["HybridDrafting"]


class HybridDrafting(SessionDrafting):
    """The index beside one of vLLM's model drafters: a concrete class
    (:mod:`agentspec.engine.vllm.proposers`) mixes this in before that proposer, calls
    :meth:`_init_hybrid` after the proposer's own constructor, and runs the model's passes
    (:meth:`_run_model_drafter`, :meth:`_model_draft_probs`)."""

    #: The draft model's passes hold collectives: every rank must run as many.
    ranks_must_agree = True

    def _init_hybrid(self, vllm_config: VllmConfig, settings: EngineSettings | None) -> None:
        self._init_session_drafting(vllm_config, settings)
        drafter = self.settings.drafter
        if drafter is None:
            raise ValueError(
                f"agentspec runs vLLM's {vllm_config.speculative_config.method} method only for"  # type: ignore[union-attr]
                " hybrid drafting: start the server with agentspec serve --agentspec-drafter MODEL"
            )
        self.max_draft_tokens: int = vllm_config.speculative_config.num_speculative_tokens  # type: ignore[union-attr]
        self.model_draft_tokens = min(drafter.num_tokens, self.max_draft_tokens)
        self.hybrid_rule = HybridRule(drafter.rule)
        # Handed over by the plugin before each propose: (input batch, sampled tokens per row).
        self._step: tuple[Any, list[list[int]]] | None = None
        # Per request: the path and length of the draft sent for verification last step.
        self._sent: dict[str, tuple[DraftPath, int]] = {}

    # ------------------------------------------------------------------ plugin hooks

    def take_step(self, input_batch: Any, sampled: list[list[int]]) -> None:
        """This step's tokens per batch row (empty for a partial prefill), before
        :meth:`propose`; the runner has not added them to ``input_batch`` yet."""
        self._step = (input_batch, sampled)

    def on_requests_finished(self, req_ids: Any) -> None:
        req_ids = list(req_ids)
        for req_id in req_ids:
            self._sent.pop(req_id, None)
        super().on_requests_finished(req_ids)

    # ------------------------------------------------------------------ vLLM's proposer interface

    def _choose(
        self, index_len: int, draft: Draft | None, expected: float, model_len: int, model_expected: float
    ) -> DraftPath:
        """The request's path by the configured rule (``drafter.rule``)."""
        score = draft.score if draft is not None else 0.0
        return self.hybrid_rule.choose(index_len, score, expected, model_len, model_expected)

    def propose(self, num_speculative_tokens: int, **kwargs: Any) -> list[list[int]]:  # type: ignore[override]
        """Draft for every request of the step: the index's draft or the model's."""
        if self._step is None:
            raise RuntimeError(
                f"{type(self).__name__}.propose called without the step's tokens (is the plugin installed?)"
            )
        input_batch, sampled_rows = self._step
        self._step = None
        started = perf_counter()
        self._time_step(input_batch.req_ids, sampled_rows, started)
        rows = len(sampled_rows)
        budget = self.driver.budget_for(rows, num_speculative_tokens)
        cost = self.driver.budget if isinstance(self.driver.budget, CostBudget) else None
        # Output tokens a verified token and a drafter pass cost (0: unpriced).
        token_price, pass_price = cost.step_prices(rows) if cost is not None else (0.0, 0.0)
        model_cap = self.hybrid_rule.paying_length(min(self.model_draft_tokens, budget), token_price)
        suffix: list[Draft | None] = []
        paths: list[DraftPath] = []
        model_lens: list[int] = []
        gains: list[float] = []  # per request that chose the model: net tokens over its index draft
        for i, sampled in enumerate(sampled_rows):
            req_id = input_batch.req_ids[i]
            if not sampled:  # a partial prefill: nothing sampled, nothing to draft
                suffix.append(None)
                paths.append(DraftPath.NONE)
                model_lens.append(0)
                continue
            num_tokens = int(input_batch.num_tokens_no_spec[i]) + len(sampled)
            room = self.max_model_len - num_tokens - 1
            draft = self._index_draft(input_batch, i, req_id, sampled, num_tokens, min(budget, room))
            index_len = len(draft.token_ids) if draft is not None else 0
            expected = 0.0
            if draft is not None:
                spec = self.driver.spec(req_id)
                expected = self.index.expected_accepted(draft, spec.tenant if spec is not None else "")
            model_len = max(0, min(model_cap, room)) if self.driver.may_draft(req_id) else 0
            suffix_net = net_tokens(expected, index_len, token_price)
            model_net = net_tokens(self.hybrid_rule.model_expected(model_len), model_len, token_price)
            path = self._choose(index_len, draft, suffix_net, model_len, model_net)
            if path is DraftPath.MODEL:
                gains.append(model_net - max(0.0, suffix_net) if index_len else model_net)
            suffix.append(draft)
            paths.append(path)
            model_lens.append(model_len)

        run_model = model_runs(paths)
        if run_model and self.hybrid_rule.rule == "expected" and not passes_pay(gains, model_cap - 1, pass_price):
            # The passes cost more than the model's drafts add: the index drafts the step.
            run_model = False
            self._count("drafter_runs_unpaid_total")
            paths = [
                DraftPath.SUFFIX if p is DraftPath.MODEL and d is not None and d.token_ids else p
                for p, d in zip(paths, suffix, strict=True)
            ]
            paths = [DraftPath.NONE if p is DraftPath.MODEL else p for p in paths]
        for i, path in enumerate(paths):
            draft = suffix[i]
            if path is not DraftPath.SUFFIX and draft is not None and draft.token_ids:
                self.driver.withdraw(input_batch.req_ids[i])
        model_started = perf_counter()
        # Always the first pass (the draft KV cache of the verified tokens); the
        # autoregressive passes only when some request takes the model's draft.
        model_out = self._run_model_drafter(model_cap if run_model else 0, **kwargs)
        model_seconds = perf_counter() - model_started
        self._count("drafter_seconds_total", model_seconds)
        self._count("drafter_runs_total" if run_model else "drafter_runs_skipped_total")
        if self.driver.budget is not None and self._clock_steers:
            self.driver.budget.observe_drafter(max(0, model_cap - 1) if run_model else 0, model_seconds)
        model_rows = model_out.tolist() if run_model else None
        probs = self._model_draft_probs()

        drafts: list[list[int]] = []
        tokens: list[int]
        for i, path in enumerate(paths):
            req_id = input_batch.req_ids[i]
            if path is DraftPath.SUFFIX:
                tokens = suffix[i].token_ids  # type: ignore[union-attr]
                if probs is not None:
                    tokens = self._one_hot_rows(probs, i, tokens)
            elif path is DraftPath.MODEL:
                tokens = model_rows[i][: model_lens[i]]  # type: ignore[index]
            else:
                tokens = []
            if sampled_rows[i]:
                # Steps without a draft count as drafts of the "none" path.
                path = path if tokens else DraftPath.NONE
                self._count(f"{path.value}_drafts_total")
                if tokens:
                    self._sent[req_id] = (path, len(tokens))
                    self._count(f"{path.value}_draft_tokens_total", len(tokens))
            drafts.append(tokens)

        self._end_propose(input_batch, len(drafts), started, budget)
        self._end_step(input_batch.req_ids, drafts)
        return drafts

    # ------------------------------------------------------------------ the model drafter (vLLM's)

    def _run_model_drafter(self, num_speculative_tokens: int, **kwargs: Any) -> torch.Tensor:
        """Run the model drafter's passes: the first always, ``num_speculative_tokens`` in
        all (0: the first pass only); one row of drafted tokens per request."""
        raise NotImplementedError

    def _model_draft_probs(self) -> torch.Tensor | None:
        """The draft probabilities the model drafter kept for rejection sampling, if any
        (rows are edited in place for the index's drafts)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ internals

    def _index_draft(
        self,
        input_batch: Any,
        i: int,
        req_id: str,
        sampled: list[int],
        num_tokens: int,
        cap: int,
    ) -> Draft | None:
        """Settle the request's last draft, index its new tokens, and draft from the index."""
        try:
            self._catch_up(input_batch, i, req_id, num_tokens - len(sampled))
            self._settle_model_draft(req_id, sampled)
            self._begin_or_settle(input_batch, i, req_id, sampled, num_tokens)
            self._seen[req_id] = num_tokens
            return self.driver.draft(req_id, cap)
        except DraftIndexError as exc:
            # Never fail the engine over drafting: the index sits this request out.
            logger.warning("request %s: index drafting disabled: %s", req_id, exc)
            self.driver.disable(req_id)
            return None

    def _take_missed(self, req_id: str, missed: list[int]) -> None:
        # The catch-up is SessionDrafting's (_catch_up, catch_up_finished); the draft sent
        # before the missed steps was settled there, so it is not settled by path either.
        self._sent.pop(req_id, None)
        super()._take_missed(req_id, missed)

    def _settle_model_draft(self, req_id: str, sampled: list[int]) -> None:
        """Record what the target accepted of the request's last draft, by path (the
        index's own record is :meth:`_begin_or_settle`'s)."""
        path, drafted = self._sent.pop(req_id, (DraftPath.NONE, 0))
        if not drafted:
            return
        accepted = max(0, min(len(sampled) - 1, drafted))
        self._count(f"{path.value}_accepted_tokens_total", accepted)
        if path is DraftPath.MODEL:
            self.hybrid_rule.observe_model(drafted, accepted)
            if self.index.has_call(req_id):
                self.index.record_model_verification(req_id, drafted, accepted)

    def _one_hot_rows(self, probs: torch.Tensor, row: int, tokens: list[int]) -> list[int]:
        """Give row ``row`` of vLLM's draft probabilities the one-hot rows of the index's
        deterministic draft, which makes rejection sampling exact for it; the draft is
        cut to the rows vLLM holds."""
        tokens = tokens[: probs.shape[1]]
        if tokens:
            probs[row, : len(tokens)].zero_()
            index = torch.arange(len(tokens), device=probs.device)
            probs[row, index, torch.tensor(tokens, device=probs.device)] = 1.0
        return tokens
