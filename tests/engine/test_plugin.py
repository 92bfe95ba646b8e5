"""The plugin's start-up behaviour (no server needed)."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("vllm")

from agentspec.engine import config, plugin


def test_inert_without_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(config.ENV_CONFIG, raising=False)
    before = list(sys.meta_path)
    plugin.register()
    assert sys.meta_path == before


def test_unsupported_vllm_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    monkeypatch.setenv(config.ENV_CONFIG, "{}")
    monkeypatch.setattr(vllm, "__version__", "0.31.2")
    with pytest.raises(plugin.UnsupportedVLLMError, match=r"supports vLLM 0\.32\.x; this is vLLM 0\.31\.2"):
        plugin.register()


def test_bad_settings_fail_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config.ENV_CONFIG, '{"full_draft_batch": 0}')
    with pytest.raises(ValueError, match="full_draft_batch"):
        plugin.register()


def test_installed_version_supported() -> None:
    assert plugin.check_vllm_version().startswith(plugin.SUPPORTED_VLLM_SERIES)


@pytest.mark.parametrize(("tp", "pp", "alone"), [(1, 1, True), (2, 1, False), (1, 2, False)])
def test_exchange_only_for_a_rank_alone_in_its_groups(tp: int, pp: int, alone: bool) -> None:
    from types import SimpleNamespace

    parallel = SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    runner = SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=parallel))
    assert plugin._is_alone_in_group(runner) is alone
