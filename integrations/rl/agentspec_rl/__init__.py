"""agentspec for RL rollouts: GRPO groups pinned to one engine, token in and token out.

- :class:`RolloutClient` / :class:`AsyncRolloutClient`: ``n`` samples of a prompt as one
  group (one agentspec session per sample, the group pinned to one server so its samples
  draft from each other), multi-turn with an environment step function, exact token ids,
  log-probabilities, stop reasons and the policy version of every sample;
- :class:`SamplingParams`, :class:`Sample`, :class:`Group`, :class:`EnvStep`.

Needs agentspec's light client only: no vLLM in the trainer's environment.
"""

from agentspec_rl.client import AsyncRolloutClient, Environment, RolloutClient
from agentspec_rl.sampling import SamplingParams
from agentspec_rl.types import EnvStep, Group, RolloutError, Sample, SampleState

__all__ = [
    "AsyncRolloutClient",
    "EnvStep",
    "Environment",
    "Group",
    "RolloutClient",
    "RolloutError",
    "Sample",
    "SampleState",
    "SamplingParams",
]
