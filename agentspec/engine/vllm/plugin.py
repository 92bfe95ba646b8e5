"""The ``vllm.general_plugins`` entry point: wires agentspec's drafting into vLLM.

vLLM runs :func:`register` in every process it starts. Nothing happens unless
:data:`agentspec.engine.settings.ENV_CONFIG` is set (``agentspec serve`` sets it): installing
agentspec leaves a plain vLLM server untouched. With it set, :func:`register` checks the
settings and vLLM's version (an unsupported vLLM fails at start-up, naming the supported
series), then wires agentspec into the model runner that vLLM series has
(:data:`~agentspec.engine.vllm.surface.RUNNER_OF_SERIES`):

- vLLM 0.34 and later (Model Runner V2 only): registers the speculative method
  ``agentspec`` (:mod:`agentspec.engine.vllm.speculator_config`), and arranges for the V2
  runner's request bookkeeping to be wrapped (:mod:`agentspec.engine.vllm.runner_v2`);
- vLLM 0.32 and 0.33: pins vLLM's V1 model runner (:func:`pin_model_runner`), and arranges
  for the runner module (:mod:`agentspec.engine.vllm.runner`) and the workers
  (:mod:`agentspec.engine.vllm.workers`) to be patched when a worker process imports them.

Every part of vLLM this package reads or patches is listed in
:mod:`agentspec.engine.vllm.surface`.
"""

from __future__ import annotations

import os

from agentspec._extras import install_hint
from agentspec.engine import settings as engine_settings
from agentspec.engine.vllm import runner, runner_v2, surface, workers
from agentspec.engine.vllm.errors import UnsupportedVLLMError
from agentspec.engine.vllm.import_hook import patch_when_imported
from agentspec.engine.vllm.surface import SUPPORTED_VLLM_SERIES, V2_RUNNER_ENV, supported_series_text

__all__ = ["SUPPORTED_VLLM_SERIES", "V2_RUNNER_ENV", "UnsupportedVLLMError", "register"]


def register() -> None:
    """Entry point, run by vLLM in every process it starts (possibly more than once)."""
    if not engine_settings.enabled():
        return
    engine_settings.load_settings()  # bad settings fail here, at start-up, in every process
    if surface.runner_of(check_vllm_version()) == "v2":
        register_speculator()
        patch_when_imported(runner_v2.RUNNER_MODULE, runner_v2.patch_runner)
        return
    pin_model_runner()
    check_model_runner()
    patch_when_imported(runner.RUNNER_MODULE, runner.patch_runner)
    patch_when_imported(workers.GPU_WORKER_MODULE, workers.patch_gpu_worker)
    patch_when_imported(workers.CPU_WORKER_MODULE, workers.patch_cpu_worker)


def register_speculator() -> None:
    """Register ``method: agentspec`` with Model Runner V2 (by qualified name: vLLM imports
    the config where it needs it). Registering again, as vLLM may in one process, is a no-op."""
    surface.load("register_speculative_method")(
        surface.V2_METHOD, "agentspec.engine.vllm.speculator_config.AgentspecSpeculatorConfig"
    )


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
    if surface.series_of(version) not in SUPPORTED_VLLM_SERIES:
        raise UnsupportedVLLMError(
            f"agentspec's engine plugin supports vLLM {supported_series_text()};"
            f" this is vLLM {version}. Install a supported vLLM ({install_hint('serve')}),"
            f" or unset {engine_settings.ENV_CONFIG} to run vLLM without agentspec."
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
    if surface.load("v2_runner_env"):
        raise UnsupportedVLLMError(
            f"agentspec patches vLLM's V1 model runner ({runner.RUNNER_MODULE}), but"
            f" {V2_RUNNER_ENV}={os.environ.get(V2_RUNNER_ENV)} selects the V2 model runner,"
            f" which agentspec does not support. Unset {V2_RUNNER_ENV} (or set it to 0),"
            f" or unset {engine_settings.ENV_CONFIG} to run vLLM without agentspec."
        )
