"""Replay benchmark: recorded agent trajectories through speculative drafters.

Python API::

    from agentspec.replay import ReplayConfig, run_replay

    result = run_replay(ReplayConfig(sources=("tau_bench",), replicas=8))
    print(result.record("agentspec").al)

See ``docs/bench.md`` for the method, the options and the cost model.
"""

from agentspec.replay.calls import CallSpec, ReplayCall, StaticCall, static_call
from agentspec.replay.config import ReplayConfig, Routing
from agentspec.replay.cost import CostModel
from agentspec.replay.proposer import Draft, Proposer, ProposerFactory, ProposerSettings
from agentspec.replay.registry import builtin_proposers, make_proposer, proposer_names
from agentspec.replay.run import Record, ReplayResult, replay_workloads, run_replay, summarise

__all__ = [
    "CallSpec",
    "CostModel",
    "Draft",
    "Proposer",
    "ProposerFactory",
    "ProposerSettings",
    "Record",
    "ReplayCall",
    "ReplayConfig",
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
