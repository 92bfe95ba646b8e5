"""Training a drafter for the steps the draft index cannot draft (``agentspec train-drafter``).

An EAGLE-3 head for the target model, trained in plain torch on the user's own recorded
calls, weighted toward the output tokens the index had no confident draft for, and written
in the layout vLLM loads beside the index (``agentspec serve --agentspec-drafter OUT
--agentspec-drafter-method eagle3``). Needs torch, transformers and safetensors (the
``train`` extra); the modules, one idea each:

- :mod:`~agentspec.training.config`: :class:`DrafterTrainingConfig`, what a run is asked;
- :mod:`~agentspec.training.examples`: the calls as token ids, and each token's weight;
- :mod:`agentspec.head` (below both training and the replay): the head, its checkpoint as
  vLLM reads it, and the target model as the teacher;
- :mod:`~agentspec.training.trainer`: the loop, its checkpoints and resume;
- :mod:`~agentspec.training.evaluate`: acceptance on held-out calls.
"""

from __future__ import annotations

from agentspec.training.config import DrafterTrainingConfig

__all__ = ["DrafterTrainingConfig"]
