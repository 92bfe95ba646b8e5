"""agentspec's speculator on vLLM's Model Runner V2 (vLLM 0.34 and later).

vLLM builds :class:`AgentspecSpeculator` for ``method: agentspec``
(:mod:`agentspec.engine.vllm.speculator_config`) and calls :meth:`~AgentspecSpeculator.propose`
after every step's sampling. The drafting is :class:`~agentspec.engine.worker.drafting.SuffixDrafting`'s,
the same code the V1 runner's proposer runs; this class only moves tokens between the
device and the host:

- **to the host**, once per step: each request's tokens of this step (what the target
  sampled, accepted drafts and the bonus token), its total length and the number sampled,
  gathered on the device into one small ``[num_reqs, k + 3]`` tensor and copied in one go.
  A request's prompt is read once, when it is first drafted for; tokens the speculator
  missed (none on V2, which calls it every step) would be read the same way;
- **to the device**: the drafts, ``[num_reqs, k]``, a draft shorter than ``k`` padded with
  the request's last sampled token. V2's runner reports the same width for every request
  to the scheduler, which then has the target verify ``k`` slots of each; the plugin
  narrows each request's width to its real draft (:attr:`AgentspecSpeculator.draft_widths`,
  read by :func:`agentspec.engine.vllm.runner_v2.narrow_draft_widths`), so the target
  verifies what agentspec drafted and no padding, as on the V1 runner. (The scheduler
  takes per-request widths already: structured outputs shorten drafts the same way.)

The round trip synchronises the host with the device once per step, which vLLM's own
suffix method (drafting on the device) avoids; so the speculator refuses async
scheduling, under which the wait would silently undo the overlap that async scheduling
exists for (``agentspec serve`` turns it off). What the round trip costs is counted
(``host_copy_seconds_total``, ``host_copy_steps_total``).

What the V2 runner does not pass a speculator (a new request's sampling parameters, where
its session, group, tenant and seeds are) reaches it through the runner's ``add_requests``,
which :mod:`agentspec.engine.vllm.runner_v2` wraps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import numpy as np
import torch
from vllm.config.vllm import VllmConfig
from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

from agentspec.engine import settings as engine_settings
from agentspec.engine.settings import EngineSettings
from agentspec.engine.vllm.errors import UnsupportedVLLMError
from agentspec.engine.vllm.runner import _is_alone_in_group, _is_publishing_rank, worker_name
from agentspec.engine.worker.drafting import SuffixDrafting
from agentspec.index import DraftIndex

__all__ = ["AgentspecSpeculator"]

logger = logging.getLogger("vllm.agentspec.speculator")


class _HistoryRows:
    """Rows of the runner's token history (``[max_num_reqs, max_model_len]`` on the device)
    as the drafting reads them, by batch row: ``rows[i]`` (all of row ``i``'s tokens so far)
    and ``rows[i, a:b]``, each copied to the host when read."""

    def __init__(self, history: torch.Tensor, slots: np.ndarray, lengths: np.ndarray) -> None:
        self._history, self._slots, self._lengths = history, slots, lengths

    def __getitem__(self, key: int | tuple[int, slice]) -> np.ndarray:
        if isinstance(key, tuple):
            i, cols = key
            return self._history[int(self._slots[i]), cols].cpu().numpy()
        return self._history[int(self._slots[key]), : int(self._lengths[key])].cpu().numpy()


@dataclass(frozen=True)
class _HostBatch:
    """The step's batch as :meth:`SuffixDrafting.propose` reads one (V1's input batch's
    names): request ids, prompt lengths, tokens so far (this step's included), the rows."""

    req_ids: list[str]
    num_prompt_tokens: np.ndarray
    num_tokens_no_spec: np.ndarray
    token_ids_cpu: _HistoryRows


class AgentspecSpeculator(SuffixDrafting, BaseSpeculator):
    """Session-aware suffix drafting as a V2 speculator (see the module's docstring)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        device: torch.device,
        req_states: Any,
        settings: EngineSettings | None = None,
    ) -> None:
        if getattr(vllm_config.scheduler_config, "async_scheduling", False):
            raise UnsupportedVLLMError(
                "agentspec's speculator drafts on the host from each step's tokens, which makes every step"
                " wait for the device; under async scheduling that wait would undo the overlap async scheduling"
                " is for. Pass --no-async-scheduling (agentspec serve does), or unset"
                f" {engine_settings.ENV_CONFIG} to run vLLM without agentspec."
            )
        self._init_session_drafting(vllm_config, settings)
        self.vllm_config = vllm_config
        self.device = device
        self.req_states = req_states
        self.num_speculative_steps = self.num_speculative_tokens
        max_reqs = vllm_config.scheduler_config.max_num_seqs
        k = self.num_speculative_tokens
        self._drafts = torch.zeros(max_reqs, k, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        self._host_drafts = torch.zeros(max_reqs, k, dtype=torch.int64, pin_memory=pin)
        # Offsets of the last k + 1 positions of a row: a step samples at most k + 1 tokens.
        self._tail = torch.arange(-(k + 1), 0, dtype=torch.int64, device=device)
        self._bound = False
        #: The last step's real draft length per request (its padding excluded).
        self.draft_widths: dict[str, int] = {}

    # ------------------------------------------------------------------ vLLM's interface

    def init_cudagraph_manager(self, cudagraph_mode: Any) -> None:
        """Nothing to capture: the drafting runs on the host."""

    def capture(self) -> None:
        """Nothing to capture: the drafting runs on the host."""

    def reset_state(self) -> None:
        """After vLLM's warm-up requests: forget them (a fresh index, the same settings)."""
        self.index = DraftIndex(self.index.config)
        self.driver = type(self.driver)(self.index, self.driver.budget)
        self._seen.clear()

    def propose(  # type: ignore[override]
        self,
        input_batch: Any,
        attn_metadata: Any,
        slot_mappings: Any,
        last_hidden_states: torch.Tensor,
        aux_hidden_states: Any,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        last_sampled: torch.Tensor,
        next_prefill_tokens: torch.Tensor,
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        dp_sync_state: Any = None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        mm_inputs: Any = None,
        is_profile: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> torch.Tensor:
        n = int(input_batch.num_reqs)
        slots = input_batch.idx_mapping[:n]
        out = self._drafts[:n]
        if dummy_run or is_profile or n == 0:
            out.copy_(last_sampled[slots].unsqueeze(1).expand_as(out))
            return out
        self.ensure_bound()
        k = self.num_speculative_tokens
        width = k if num_speculative_tokens is None else max(0, min(num_speculative_tokens, k))
        started = perf_counter()
        batch, sampled = self._to_host(input_batch, n, num_sampled)
        copied = perf_counter() - started
        drafts = SuffixDrafting.propose(self, width, batch, sampled)
        back = perf_counter()
        host = self._host_drafts[:n].numpy()
        for i, (draft, row) in enumerate(zip(drafts, sampled, strict=True)):
            host[i, :] = row[-1] if row else 0
            host[i, : len(draft)] = draft
        self.draft_widths = {req_id: len(d) for req_id, d in zip(batch.req_ids, drafts, strict=True)}
        out.copy_(self._host_drafts[:n], non_blocking=True)
        self._count("host_copy_seconds_total", copied + perf_counter() - back)
        self._count("host_copy_steps_total")
        self.on_step_end(idle=False)
        return out

    def on_requests_finished(self, req_ids: Any) -> None:  # type: ignore[override]
        """Finished requests, while their rows still hold their tokens: index any the
        speculator did not see, then release them."""
        states = self.req_states
        for req_id in req_ids:
            slot = states.req_id_to_index.get(req_id)
            seen = self._seen.get(req_id)
            if slot is None or seen is None:
                continue
            prompt = int(states.prompt_len.np[slot])
            total = int(states.total_len.gpu[slot].item())
            if seen < total:
                self.catch_up_finished(req_id, prompt, states.all_token_ids.gpu[slot, prompt:total].tolist())
        SuffixDrafting.on_requests_finished(self, req_ids)
        self.on_step_end(idle=len(states.req_id_to_index) <= len(set(req_ids)))

    # ------------------------------------------------------------------ agentspec's side

    def ensure_bound(self) -> None:
        """Bind once, with what only the running worker knows (its rank and group)."""
        if not self._bound:
            self.bind(
                publish=_is_publishing_rank(), worker_name=worker_name(self), alone_in_group=_is_alone_in_group(self)
            )
            self._bound = True

    def _to_host(self, input_batch: Any, n: int, num_sampled: torch.Tensor) -> tuple[_HostBatch, list[list[int]]]:
        """The step's tokens on the host: one gather on the device, one copy."""
        states = self.req_states
        slots = input_batch.idx_mapping[:n]
        history = states.all_token_ids.gpu
        total = states.total_len.gpu[slots].to(torch.int64)
        positions = (total.unsqueeze(1) + self._tail).clamp_(min=0)
        tail = history[slots.unsqueeze(1), positions].to(torch.int64)
        packed = (
            torch.cat([num_sampled[:n].to(torch.int64).unsqueeze(1), total.unsqueeze(1), tail], dim=1).cpu().numpy()
        )
        counts, lengths, tails = packed[:, 0], packed[:, 1], packed[:, 2:]
        slots_np = np.asarray(input_batch.idx_mapping_np[:n])
        sampled = [tails[i, tails.shape[1] - int(c) :].tolist() if c > 0 else [] for i, c in enumerate(counts)]
        batch = _HostBatch(
            req_ids=list(input_batch.req_ids[:n]),
            num_prompt_tokens=states.prompt_len.np[slots_np],
            num_tokens_no_spec=lengths,
            token_ids_cpu=_HistoryRows(history, slots_np, lengths),
        )
        return batch, sampled
