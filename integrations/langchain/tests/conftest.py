"""Fixtures of langchain-agentspec's tests.

- ``stubs``: two of agentspec's stub servers (real HTTP, instant answers, the server's id
  and seed checks, per-session counters, injectable failures) for the unit tests;
- ``agentspec_url``: a real ``agentspec serve`` on the tiny test model for the integration
  tests. Set ``AGENTSPEC_TEST_BASE_URL`` to use a server that is already running (it must
  serve the model as ``tiny`` with ``--enable-auto-tool-choice --tool-call-parser hermes``);
  otherwise agentspec's pytest plugin starts one for the test session (about a minute).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentspec.testing.stub import StubServer

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
def agentspec_url(request: pytest.FixtureRequest) -> str:
    """Base URL (without ``/v1``) of a real agentspec server on the tiny model."""
    if url := os.environ.get(TEST_URL_ENV):
        return url.rstrip("/").removesuffix("/v1")
    # agentspec's pytest plugin starts it once per test session, shared with agentspec's
    # own server tests when both run together.
    return request.getfixturevalue("agentspec_server").url
