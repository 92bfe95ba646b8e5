"""Fixtures of openhands-agentspec's tests.

- ``stub``: agentspec's stub server (real HTTP, the server's id and seed checks,
  per-session counters, injectable failures) for the unit tests;
- ``workspace``: an empty folder for the agent's tools;
- ``codeact``: real CodeAct conversations against ``agentspec serve`` (codeact_harness.py);
- ``real_codeact``: the same on the real model (SmolLM2-135M-Instruct, agentspec's
  ``agentspec_real_server``).

The real servers come from agentspec's pytest plugin. This environment (Python 3.12,
openhands-sdk) has no vLLM: ``$AGENTSPEC_SERVER_PYTHON`` names an interpreter that has
``vllm-agentspec[cpu]``, which builds the tiny model and runs the servers
(scripts/test_openhands.sh sets it).
"""

from __future__ import annotations

import os

# Before OpenHands is imported: no network look-up of litellm's price list, no banner.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from codeact_harness import CodeAct

from agentspec.testing.server_kinds import REAL_MODEL_NAME
from agentspec.testing.stub import StubServer


@pytest.fixture
def stub() -> Iterator[StubServer]:
    server = StubServer(name="openhands", model="tiny")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    return path


@pytest.fixture
def codeact(agentspec_server: Any, workspace: Path) -> CodeAct:
    """Conversations straight to ``agentspec serve``."""
    return CodeAct(agentspec_server.url, workspace)


@pytest.fixture
def real_codeact(agentspec_real_server: Any, workspace: Path) -> CodeAct:
    """Conversations straight to ``agentspec serve`` on the real model (SmolLM2-135M-Instruct)."""
    return CodeAct(agentspec_real_server.url, workspace, model=REAL_MODEL_NAME)
