"""Fixtures for the client tests: two stub OpenAI servers (real HTTP, in threads) shared by
the whole test session and reset before each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from agentspec.client import ClientConfig, RetryPolicy
from agentspec.testing.stub import StubServer


@pytest.fixture(scope="session")
def _stub_pair() -> Iterator[tuple[StubServer, StubServer]]:
    a, b = StubServer(name="a").start(), StubServer(name="b").start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def stubs(_stub_pair: tuple[StubServer, StubServer]) -> tuple[StubServer, StubServer]:
    """Both stubs running, with no recorded requests and no injected faults."""
    for stub in _stub_pair:
        stub.start()  # a test may have stopped it; it comes back on the same port
        stub.reset()
    return _stub_pair


@pytest.fixture
def config(stubs: tuple[StubServer, StubServer]) -> ClientConfig:
    return ClientConfig(
        backends=[s.url for s in stubs],
        model="stub-model",
        api_key="secret",
        health_check_interval_s=None,  # tests drive health explicitly
        retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0),
    )


@pytest.fixture
def stub_at(stubs: tuple[StubServer, StubServer]) -> Callable[[str | None], StubServer]:
    """``stub_at(url)``: the stub serving ``url``."""

    def find(url: str | None) -> StubServer:
        for stub in stubs:
            if stub.url == url:
                return stub
        raise AssertionError(f"no stub at {url}")

    return find
