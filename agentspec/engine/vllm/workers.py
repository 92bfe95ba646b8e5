"""The workers' check of the model runner they built.

Everything agentspec patches is in vLLM's V1 model runner. vLLM builds its V2 runner
instead where ``VllmConfig.use_v2_model_runner`` says so: the plugin pins V1
(:func:`agentspec.engine.vllm.plugin.pin_model_runner`), but watermarking and HiSparse
force V2 whatever the pin says, and only the worker sees the runner it built (plugins get
no config). So ``Worker._make_model_runner`` (GPU, and the platforms that keep it) and
``CPUWorker.init_device`` are wrapped: anything but the patched V1 runner with an
agentspec drafter stops the server with one line.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from agentspec.engine import settings as engine_settings
from agentspec.engine.vllm import surface
from agentspec.engine.vllm.errors import UnsupportedVLLMError
from agentspec.engine.vllm.import_hook import is_patched, mark_patched
from agentspec.engine.vllm.runner import RUNNER_MODULE
from agentspec.engine.vllm.surface import V2_RUNNER_ENV, supported_series_text

#: The workers whose runner construction is checked (GPU, and CPU: a subclass).
GPU_WORKER_MODULE = surface.module_of("gpu_worker_module")
CPU_WORKER_MODULE = surface.module_of("cpu_worker_module")
#: What V1 costs a user: the features only vLLM's V2 runner has (``VllmConfig.
#: _get_v1_model_runner_unsupported_features``, and HiSparse, which requires V2).
V1_COST = (
    "agentspec runs vLLM's V1 model runner, without the features only V2 has:"
    " prefill context parallel, DSpark, adaptive verification, HiSparse"
    " (and in vLLM 0.33 Xpress drafting and a quantized draft lm_head)"
)


def check_built_runner(runner: Any) -> None:
    """Raise :class:`UnsupportedVLLMError` unless ``runner`` (what a worker just built) is
    the patched V1 runner and, with speculative decoding, drafts with an agentspec proposer:
    otherwise the server would run without agentspec in the loop, with no error."""
    from agentspec.engine.worker.drafting import SessionDrafting

    module = sys.modules.get(RUNNER_MODULE)
    v1 = getattr(module, "GPUModelRunner", None)
    built = f"{type(runner).__module__}.{type(runner).__qualname__}"
    if v1 is None or not isinstance(runner, v1):
        raise UnsupportedVLLMError(
            f"agentspec patches vLLM's V1 model runner ({RUNNER_MODULE}), but vLLM built {built}"
            f" (its V2 runner): watermarking and HiSparse attention force V2 whatever {V2_RUNNER_ENV} says."
            f" Turn them off, or unset {engine_settings.ENV_CONFIG} to run vLLM without agentspec; {V1_COST}."
        )
    if not is_patched(module):
        raise UnsupportedVLLMError(
            f"vLLM built its V1 model runner ({built}) from a module agentspec did not patch"
            f" ({RUNNER_MODULE} was imported before the plugin ran): restart the server with"
            f" {engine_settings.ENV_CONFIG} set in every process; {V1_COST}."
        )
    spec = getattr(runner, "speculative_config", None)
    # Only the last pipeline-parallel rank has a drafter.
    if spec is not None and hasattr(runner, "drafter") and not isinstance(runner.drafter, SessionDrafting):
        drafter = type(runner.drafter)
        raise UnsupportedVLLMError(
            f"vLLM's drafter here is {drafter.__module__}.{drafter.__qualname__} (speculative method"
            f" {getattr(spec, 'method', None)!r}), not agentspec's, so agentspec would not draft: it drafts"
            " through method suffix (agentspec serve) and draft_model, eagle, eagle3 (agentspec serve"
            f" --agentspec-drafter). Use one of them, or unset {engine_settings.ENV_CONFIG} to run vLLM without"
            f" agentspec; {V1_COST}."
        )


def patch_gpu_worker(module: ModuleType) -> None:
    """Check the runner ``Worker._make_model_runner`` builds (the GPU worker's, and those
    of the platforms that subclass it and keep it)."""
    _check_runner_after(module, "gpu_worker._make_model_runner", built=lambda self, result: result)


def patch_cpu_worker(module: ModuleType) -> None:
    """Check the runner ``CPUWorker.init_device`` builds (it does not call
    ``_make_model_runner``)."""
    _check_runner_after(module, "cpu_worker.init_device", built=lambda self, result: self.model_runner)


def _check_runner_after(module: ModuleType, key: str, built: Callable[[Any, Any], Any]) -> None:
    """Wrap the worker method ``key`` of ``module`` so that the runner it built
    (``built(worker, result)``) goes through :func:`check_built_runner`."""
    if is_patched(module):
        return
    method = surface.find(module, key)
    if method is None:
        raise UnsupportedVLLMError(
            f"{module.__name__} lacks {key}; this vLLM's internals differ from"
            f" the supported vLLM {supported_series_text()}."
        )
    owner_name, name = surface.part(key).paths[0].partition(":")[2].split(".")
    owner = getattr(module, owner_name)

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        check_built_runner(built(self, result))
        return result

    setattr(owner, name, wrapper)
    mark_patched(module)
