"""Replay benchmark: recorded agent trajectories through speculative drafters.

Python API::

    from agentspec.replay import ReplayConfig, run_replay

    result = run_replay(ReplayConfig(sources=("tau_bench",), replicas=8))
    print(result.record("agentspec").al)

See ``docs/bench.md`` for the method, the options and the cost model. The benchmark needs
the ``bench`` extra (README, "Installing"). The names below load on first
use (PEP 562), so that ``agentspec bench --help`` and the settings classes import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentspec.replay.calls import CallSpec, ReplayCall, StaticCall, static_call
    from agentspec.replay.config import ReplayConfig, Routing
    from agentspec.replay.cost import CostModel
    from agentspec.replay.proposer import Proposer, ProposerFactory, ReplayDraft
    from agentspec.replay.registry import builtin_proposers, make_proposer, proposer_names
    from agentspec.replay.run import Record, ReplayResult, replay_workloads, run_replay, summarise
    from agentspec.replay.settings import ProposerSettings

_LAZY: dict[str, str] = {
    "CallSpec": "agentspec.replay.calls",
    "ReplayCall": "agentspec.replay.calls",
    "StaticCall": "agentspec.replay.calls",
    "static_call": "agentspec.replay.calls",
    "ReplayConfig": "agentspec.replay.config",
    "Routing": "agentspec.replay.config",
    "CostModel": "agentspec.replay.cost",
    "Proposer": "agentspec.replay.proposer",
    "ProposerFactory": "agentspec.replay.proposer",
    "ReplayDraft": "agentspec.replay.proposer",
    "ProposerSettings": "agentspec.replay.settings",
    "builtin_proposers": "agentspec.replay.registry",
    "make_proposer": "agentspec.replay.registry",
    "proposer_names": "agentspec.replay.registry",
    "Record": "agentspec.replay.run",
    "ReplayResult": "agentspec.replay.run",
    "replay_workloads": "agentspec.replay.run",
    "run_replay": "agentspec.replay.run",
    "summarise": "agentspec.replay.run",
}

__all__ = [
    "CallSpec",
    "CostModel",
    "Proposer",
    "ProposerFactory",
    "ProposerSettings",
    "Record",
    "ReplayCall",
    "ReplayConfig",
    "ReplayDraft",
    "ReplayResult",
    "Routing",
    "StaticCall",
    "builtin_proposers",
    "make_proposer",
    "proposer_names",
    "replay_workloads",
    "run_replay",
    "static_call",
    "summarise",
]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from agentspec._extras import import_module

    value = getattr(import_module(module_name, "bench"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
