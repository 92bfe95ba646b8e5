"""The plugin's start-up behaviour (no server needed)."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("vllm")

from agentspec.engine import settings as engine_settings
from agentspec.engine.vllm import import_hook, plugin, workers
from agentspec.engine.vllm import runner as runner_patch


def test_inert_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(engine_settings.ENV_CONFIG, raising=False)
    before = list(sys.meta_path)
    plugin.register()
    assert sys.meta_path == before


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0"])
def test_unsupported_vllm_fails_clearly(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    import vllm

    monkeypatch.setenv(engine_settings.ENV_CONFIG, "{}")
    monkeypatch.setattr(vllm, "__version__", version)
    with pytest.raises(plugin.UnsupportedVLLMError) as err:
        plugin.register()
    # The message names what is supported, and how each series was checked.
    expected = "supports vLLM 0.32.x and 0.34.x (tested), 0.33.x (surface-checked, never run)"
    assert f"{expected}; this is vLLM {version}" in str(err.value)


def test_surface_checked_vllm_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    assert plugin.check_vllm_version() == "0.33.0"


def test_bad_settings_fail_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(engine_settings.ENV_CONFIG, '{"full_draft_batch": 0}')
    with pytest.raises(ValueError, match="full_draft_batch"):
        plugin.register()


def test_installed_version_supported() -> None:
    assert plugin.check_vllm_version().startswith(plugin.SUPPORTED_VLLM_SERIES)


@pytest.mark.parametrize(("tp", "pp", "alone"), [(1, 1, True), (2, 1, False), (1, 2, False)])
def test_exchange_only_for_a_rank_alone_in_its_groups(tp: int, pp: int, alone: bool) -> None:
    from types import SimpleNamespace

    parallel = SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    runner = SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=parallel))
    assert runner_patch._is_alone_in_group(runner) is alone


def test_v2_model_runner_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The V2 runner never calls the patched V1 code: agentspec would not be in the loop.
    monkeypatch.setenv(engine_settings.ENV_CONFIG, "{}")
    monkeypatch.setenv(plugin.V2_RUNNER_ENV, "1")
    with pytest.raises(plugin.UnsupportedVLLMError, match=r"VLLM_USE_V2_MODEL_RUNNER=1") as err:
        plugin.register()
    # The message says what to do: drop the variable, or run vLLM without agentspec.
    assert f"Unset {plugin.V2_RUNNER_ENV}" in str(err.value)
    assert f"unset {engine_settings.ENV_CONFIG}" in str(err.value)


@pytest.mark.parametrize("value", [None, "0"])
def test_v1_model_runner_accepted(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    monkeypatch.setenv(engine_settings.ENV_CONFIG, "{}")
    monkeypatch.setenv(plugin.V2_RUNNER_ENV, value or "")  # restored after: register() pins it
    if value is None:
        monkeypatch.delenv(plugin.V2_RUNNER_ENV)
    # register() goes on to patch the runner and the workers (or hook their imports): keep
    # them out of this process, restoring sys.meta_path and patching nothing.
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    patched: list[object] = []
    monkeypatch.setattr(runner_patch, "patch_runner", patched.append)
    monkeypatch.setattr(workers, "patch_gpu_worker", lambda module: None)
    monkeypatch.setattr(workers, "patch_cpu_worker", lambda module: None)
    plugin.register()
    module = sys.modules.get(runner_patch.RUNNER_MODULE)
    if module is not None:
        assert patched == [module]
    else:
        assert any(isinstance(f, import_hook._PatchOnImport) for f in sys.meta_path)


def test_v2_model_runner_ignored_without_agentspec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(engine_settings.ENV_CONFIG, raising=False)
    monkeypatch.setenv(plugin.V2_RUNNER_ENV, "1")
    plugin.register()  # a plain vLLM server may run whichever runner it likes


def test_the_entry_point_is_the_plugin_module() -> None:
    # vLLM loads the plugin by this entry point; it must name the real module, not a moved one.
    import importlib.metadata

    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert [p.value for p in points if p.name == "agentspec"] == ["agentspec.engine.vllm.plugin:register"]
