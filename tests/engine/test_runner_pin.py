"""agentspec runs on the model runner it patches (vLLM's V1), and refuses to start otherwise.

vLLM's CPU build always picks the V1 model runner (Triton has no CPU backend there, so
``HAS_TRITON`` is false). On CUDA, ``VllmConfig.use_v2_model_runner`` picks V2 for every
speculative method V2 supports, ``draft_model`` and ``eagle3`` among them, and the patched
V1 module would never run. These tests take the CUDA path on the CPU: the config with
``vllm.config.vllm.HAS_TRITON`` true, the workers' runner construction with a V2 runner,
and a runner with async scheduling on (which the CPU platform always turns off).
"""

from __future__ import annotations

import shlex
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

pytest.importorskip("vllm")

from agentspec.engine import settings as engine_settings  # noqa: E402
from agentspec.engine.launcher.serve import build_env  # noqa: E402
from agentspec.engine.settings import EngineSettings  # noqa: E402
from agentspec.engine.vllm import (  # noqa: E402
    import_hook,
    plugin,
    runner_v2,
    workers,
)
from agentspec.engine.vllm import runner as runner_patch  # noqa: E402

#: What a user gives up with the V1 runner; every refusal names them.
V2_ONLY = ("prefill context parallel", "DSpark", "adaptive verification", "HiSparse")


@pytest.fixture
def agentspec_on(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """agentspec enabled, ``VLLM_USE_V2_MODEL_RUNNER`` unset (and put back as it was after
    the test: ``register()`` sets it), and ``register()`` patching nothing in this process.

    ``register()`` hands these patchers to ``patch_when_imported``, which runs one at once on
    a module already imported: each is replaced (``raising=True``: a renamed patcher fails
    here, not by patching vLLM for the rest of the session), and the import hooks it adds
    go with the copy of ``sys.meta_path`` when the test ends."""
    monkeypatch.setenv(engine_settings.ENV_CONFIG, "{}")
    monkeypatch.setenv(plugin.V2_RUNNER_ENV, "")  # records the value to restore
    monkeypatch.delenv(plugin.V2_RUNNER_ENV)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    for owner, name in (
        (runner_patch, "patch_runner"),
        (workers, "patch_gpu_worker"),
        (workers, "patch_cpu_worker"),
        (runner_v2, "patch_runner"),  # vLLM 0.34's path: registers no speculator either
    ):
        monkeypatch.setattr(owner, name, lambda module: None, raising=True)
    monkeypatch.setattr(plugin, "register_speculator", lambda: None, raising=True)
    return monkeypatch


def _config_with_triton(monkeypatch: pytest.MonkeyPatch, method: str) -> Any:
    """A VllmConfig as on CUDA (Triton importable) with speculative ``method``."""
    import vllm.config.vllm as vllm_config_module
    from vllm.config import SpeculativeConfig, VllmConfig

    # The config module imported the name: patching vllm.triton_utils would change nothing.
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
    spec = SpeculativeConfig(method="suffix", num_speculative_tokens=8)
    # The runner choice reads the method (and two flags, off here); a draft_model or EAGLE
    # config proper would need a model on disk.
    spec.method = method
    cfg = VllmConfig()
    cfg.speculative_config = spec
    return cfg


# ---------------------------------------------------------------------- the pin (register, serve)


def test_on_cuda_vllm_alone_picks_v2_for_the_hybrids_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    # The control: without agentspec, the patched HAS_TRITON does select V2 for draft_model.
    monkeypatch.delenv(engine_settings.ENV_CONFIG, raising=False)
    monkeypatch.setenv(plugin.V2_RUNNER_ENV, "")
    monkeypatch.delenv(plugin.V2_RUNNER_ENV)
    assert _config_with_triton(monkeypatch, "draft_model").use_v2_model_runner is True
    assert _config_with_triton(monkeypatch, "suffix").use_v2_model_runner is False


@pytest.mark.parametrize("method", ["suffix", "draft_model", "eagle3"])
def test_register_pins_the_v1_runner(agentspec_on: pytest.MonkeyPatch, method: str) -> None:
    import os

    plugin.register()
    assert _config_with_triton(agentspec_on, method).use_v2_model_runner is False
    assert os.environ[plugin.V2_RUNNER_ENV] == "0"


def test_register_under_the_fixture_patches_no_worker(agentspec_on: pytest.MonkeyPatch) -> None:
    # Imported first (as earlier tests leave them), the workers would be patched by register()
    # at once, for the rest of the session, were the fixture's stand-ins not in the way.
    from vllm.v1.worker import cpu_worker, gpu_worker

    def hooks() -> tuple[Any, ...]:
        return (
            gpu_worker.Worker._make_model_runner,
            cpu_worker.CPUWorker.init_device,
            import_hook.is_patched(gpu_worker),
            import_hook.is_patched(cpu_worker),
        )

    before = hooks()
    plugin.register()
    assert hooks() == before


def test_register_keeps_an_explicit_choice(agentspec_on: pytest.MonkeyPatch) -> None:
    agentspec_on.setenv(plugin.V2_RUNNER_ENV, "1")
    with pytest.raises(plugin.UnsupportedVLLMError, match="VLLM_USE_V2_MODEL_RUNNER=1"):
        plugin.register()


def test_register_pins_nothing_without_agentspec(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv(engine_settings.ENV_CONFIG, raising=False)
    monkeypatch.setenv(plugin.V2_RUNNER_ENV, "")
    monkeypatch.delenv(plugin.V2_RUNNER_ENV)
    plugin.register()
    assert plugin.V2_RUNNER_ENV not in os.environ


def test_serve_pins_the_v1_runner() -> None:
    assert build_env(EngineSettings(), base={})[plugin.V2_RUNNER_ENV] == "0"
    # A value of the user's own is left for the plugin to judge (1 is refused with a message).
    assert build_env(EngineSettings(), base={plugin.V2_RUNNER_ENV: "1"})[plugin.V2_RUNNER_ENV] == "1"


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--agentspec-drafter", "org/drafter"],
        ["--agentspec-drafter", "org/head", "--agentspec-drafter-method", "eagle3"],
    ],
    ids=["plain", "draft_model", "eagle3"],
)
def test_dry_run_shows_the_pinned_runner(extra: list[str]) -> None:
    import typer

    from agentspec.engine.launcher.serve import SERVE_CONTEXT, serve

    app = typer.Typer()
    app.command("serve", context_settings=SERVE_CONTEXT)(serve)
    app.command("other")(lambda: None)
    result = CliRunner().invoke(app, ["serve", "m", *extra, "--agentspec-dry-run"])
    assert result.exit_code == 0, result.output
    words = shlex.split(result.output)
    assert words[0].startswith(f"{engine_settings.ENV_CONFIG}=")
    assert f"{plugin.V2_RUNNER_ENV}=0" in words[: words.index("-m")]


# ---------------------------------------------------------------------- the workers' check


def _stub(cls: type) -> Any:
    """An instance of a vLLM class without running its constructor."""
    return cls.__new__(cls)


def _assert_one_line_refusal(err: pytest.ExceptionInfo[plugin.UnsupportedVLLMError]) -> str:
    message = str(err.value)
    assert "\n" not in message
    for feature in V2_ONLY:
        assert feature in message, message
    return message


@pytest.fixture
def hooked_gpu_worker(monkeypatch: pytest.MonkeyPatch) -> Any:
    """vLLM's GPU ``Worker`` with the plugin's hook, restored after the test."""
    from vllm.v1.worker import gpu_worker

    monkeypatch.setattr(gpu_worker.Worker, "_make_model_runner", gpu_worker.Worker._make_model_runner)
    monkeypatch.setattr(gpu_worker, import_hook.PATCHED_ATTR, False, raising=False)
    workers.patch_gpu_worker(gpu_worker)
    return gpu_worker.Worker


def test_gpu_worker_refuses_a_v2_runner(monkeypatch: pytest.MonkeyPatch, hooked_gpu_worker: Any) -> None:
    # What watermarking (or HiSparse) does whatever VLLM_USE_V2_MODEL_RUNNER says.
    from vllm.v1.worker.gpu import model_runner as v2

    class V2Runner(v2.GPUModelRunner):
        def __init__(self, vllm_config: Any, device: Any) -> None:  # no model, no device
            self.vllm_config = vllm_config

    monkeypatch.setattr(v2, "GPUModelRunner", V2Runner)
    worker = SimpleNamespace(
        use_v2_model_runner=True, vllm_config=SimpleNamespace(is_mm_encoder_only=False), device="cpu"
    )
    with pytest.raises(plugin.UnsupportedVLLMError) as err:
        hooked_gpu_worker._make_model_runner(worker)
    message = _assert_one_line_refusal(err)
    assert "V2" in message and "watermarking" in message


def test_gpu_worker_refuses_a_drafter_not_agentspecs(monkeypatch: pytest.MonkeyPatch, hooked_gpu_worker: Any) -> None:
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer
    from vllm.v1.worker import gpu_model_runner as v1

    from agentspec.engine.vllm.proposers import AgentspecProposer

    drafters = {"ngram": NgramProposer, "suffix": AgentspecProposer}

    class V1Runner(v1.GPUModelRunner):
        def __init__(self, vllm_config: Any, device: Any) -> None:
            self.vllm_config = vllm_config
            self.speculative_config = vllm_config.speculative_config
            self.drafter = _stub(drafters[self.speculative_config.method])

    monkeypatch.setattr(v1, "GPUModelRunner", V1Runner)
    monkeypatch.setattr(v1, import_hook.PATCHED_ATTR, True, raising=False)  # as register() leaves it

    def worker(method: str) -> SimpleNamespace:
        spec = SimpleNamespace(method=method)
        return SimpleNamespace(
            use_v2_model_runner=False, vllm_config=SimpleNamespace(speculative_config=spec), device="cpu"
        )

    with pytest.raises(plugin.UnsupportedVLLMError) as err:
        hooked_gpu_worker._make_model_runner(worker("ngram"))
    message = _assert_one_line_refusal(err)
    assert "NgramProposer" in message and "'ngram'" in message
    assert isinstance(hooked_gpu_worker._make_model_runner(worker("suffix")), V1Runner)


def test_an_unpatched_v1_runner_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The V1 runner module imported before the plugin could patch it: agentspec is not in the loop.
    from vllm.v1.worker import gpu_model_runner as v1

    monkeypatch.setattr(v1, import_hook.PATCHED_ATTR, False, raising=False)
    with pytest.raises(plugin.UnsupportedVLLMError) as err:
        workers.check_built_runner(_stub(v1.GPUModelRunner))
    _assert_one_line_refusal(err)


def test_cpu_worker_refuses_a_v2_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    # CPUWorker.init_device builds its runner itself (the real one needs a distributed
    # environment): a stand-in class with the same method, hooked as the plugin hooks it.
    from vllm.v1.worker.cpu import model_runner as cpu_v2

    module = ModuleType(workers.CPU_WORKER_MODULE)  # a stand-in under the worker's name

    class CPUWorker:
        def init_device(self) -> None:
            self.model_runner = _stub(cpu_v2.CPUModelRunner)

    module.CPUWorker = CPUWorker  # type: ignore[attr-defined]
    workers.patch_cpu_worker(module)
    with pytest.raises(plugin.UnsupportedVLLMError) as err:
        CPUWorker().init_device()
    _assert_one_line_refusal(err)


def test_the_hooks_sit_where_vllm_builds_its_runner() -> None:
    # The contract the hooks rely on: the GPU worker builds its runner in
    # _make_model_runner, the CPU worker in init_device (see test_vllm_contract.py).
    import inspect

    from vllm.v1.worker import cpu_worker, gpu_worker

    assert "self.model_runner: GPUModelRunner = self._make_model_runner()" in inspect.getsource(gpu_worker.Worker)
    assert "self.model_runner = CPUModelRunner(" in inspect.getsource(inspect.unwrap(cpu_worker.CPUWorker.init_device))
    assert workers.GPU_WORKER_MODULE == gpu_worker.__name__ and workers.CPU_WORKER_MODULE == cpu_worker.__name__


# ---------------------------------------------------------------------- async scheduling (the runner)


def _runner_module() -> ModuleType:
    """A stand-in for ``vllm.v1.worker.gpu_model_runner``: the real proposer classes, and a
    runner that builds its drafter from the module global as vLLM's does, without a model."""
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    module = ModuleType(runner_patch.RUNNER_MODULE)  # a stand-in under the runner's name

    class GPUModelRunner:
        def __init__(self, vllm_config: Any, device: Any) -> None:
            self.vllm_config = vllm_config
            self.use_async_scheduling = vllm_config.scheduler_config.async_scheduling
            method = vllm_config.speculative_config.method
            cls = {"suffix": module.SuffixDecodingProposer, "draft_model": module.DraftModelProposer}[method]
            self.drafter = _stub(cls)

        def _update_states(self, scheduler_output: Any) -> None: ...

        def propose_draft_token_ids(self, scheduler_output: Any, sampled_token_ids: Any) -> None: ...

    module.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    module.SuffixDecodingProposer = SuffixDecodingProposer  # type: ignore[attr-defined]
    module.DraftModelProposer = DraftModelProposer  # type: ignore[attr-defined]
    module.EagleProposer = EagleProposer  # type: ignore[attr-defined]
    return module


def test_the_hybrid_refuses_async_scheduling(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentspec.engine.vllm import fixes as vllm_fixes
    from agentspec.engine.vllm.proposers import HybridProposer

    monkeypatch.setattr(vllm_fixes, "apply", lambda: None)  # the CPU sampler fix: not here
    module = _runner_module()
    runner_patch.patch_runner(module)

    def runner(method: str, async_scheduling: bool) -> Any:
        cfg = SimpleNamespace(
            speculative_config=SimpleNamespace(method=method),
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling),
        )
        return module.GPUModelRunner(cfg, "cpu")

    # What vLLM's draft_model method defaults to on CUDA (a plain `vllm serve`).
    with pytest.raises(plugin.UnsupportedVLLMError, match="--no-async-scheduling") as err:
        runner("draft_model", True)
    assert "\n" not in str(err.value)
    assert isinstance(runner("draft_model", False).drafter, HybridProposer)
    # The suffix method: vLLM itself turns async scheduling off (or refuses it).
    runner("suffix", True)


def test_the_async_check_reads_the_config() -> None:
    from agentspec.engine.vllm.proposers import AgentspecProposer, HybridEagleProposer

    on = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=True))
    with pytest.raises(plugin.UnsupportedVLLMError, match="--no-async-scheduling"):
        runner_patch.check_async_scheduling(on, _stub(HybridEagleProposer))
    runner_patch.check_async_scheduling(on, _stub(AgentspecProposer))
    runner_patch.check_async_scheduling(on, None)  # a rank without a drafter (pipeline parallel)
    off = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False))
    runner_patch.check_async_scheduling(off, _stub(HybridEagleProposer))
