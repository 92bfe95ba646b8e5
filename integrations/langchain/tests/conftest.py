"""Fixtures of langchain-agentspec's tests.

- ``stubs``: two of agentspec's stub servers (real HTTP, instant answers, the server's id
  and seed checks, per-session counters, injectable failures) for the unit tests;
- ``agentspec_url``: a real ``agentspec serve`` on the tiny test model for the integration
  tests. Set ``AGENTSPEC_TEST_BASE_URL`` to use a server that is already running (it must
  serve the model as ``tiny`` with ``--enable-auto-tool-choice --tool-call-parser hermes``);
  otherwise one is started for the test session (about a minute) and stopped after it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentspec.client.stub import StubServer

TEST_URL_ENV = "AGENTSPEC_TEST_BASE_URL"


@pytest.fixture(scope="session")
def _stub_pair() -> Iterator[tuple[StubServer, StubServer]]:
    a, b = StubServer(name="a", model="tiny"), StubServer(name="b", model="tiny")
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def stubs(_stub_pair: tuple[StubServer, StubServer]) -> tuple[StubServer, StubServer]:
    """Two running stub servers with fresh state."""
    for stub in _stub_pair:
        if not stub.running:
            stub.start()
        stub.reset()
    return _stub_pair


@pytest.fixture
def stub(stubs: tuple[StubServer, StubServer]) -> StubServer:
    return stubs[0]


@pytest.fixture(scope="session")
def agentspec_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (without ``/v1``) of a real agentspec server on the tiny model."""
    if url := os.environ.get(TEST_URL_ENV):
        yield url.rstrip("/").removesuffix("/v1")
        return
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means no server here
        pytest.skip("vLLM is not installed (pip install 'agentspec[cpu]' or 'agentspec[vllm]')")
    from agentspec.testing.server import VLLMServer
    from agentspec.testing.tiny_model import ENV_DIR, build_tiny_model

    model_dir: Path = build_tiny_model(os.environ.get(ENV_DIR) or tmp_path_factory.mktemp("tiny"))
    server = VLLMServer.launch(model_dir, log_dir=tmp_path_factory.mktemp("vllm-logs"))
    try:
        server.wait_ready(timeout=300)
        yield server.url
    finally:
        server.stop()


_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run this package's coroutine tests on pytest-asyncio, as ``asyncio_mode=auto`` would.

    langchain-tests' async tests carry no asyncio marker (partner packages run in auto
    mode); the repository's shared pytest config is in strict mode, so they are marked here.
    """
    import inspect

    for item in items:
        func = getattr(item, "obj", None)
        if (
            inspect.iscoroutinefunction(func)
            and _HERE in Path(str(item.fspath)).parents
            and item.get_closest_marker("asyncio") is None
        ):
            item.add_marker(pytest.mark.asyncio)
