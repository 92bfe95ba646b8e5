"""The EAGLE-3 head that drafts beside the index: its model, its files, the target model
it reads, and drafting with it. Training (:mod:`agentspec.training`) writes heads and the
replay (:mod:`agentspec.replay.model_drafting`) drafts with them; both import this package,
which imports neither (an import contract in pyproject.toml). Needs torch, transformers
and safetensors (the ``train`` extra); the modules, one idea each:

- :mod:`~agentspec.head.eagle3`: the head, and its checkpoint as vLLM reads it;
- :mod:`~agentspec.head.files`: a head folder and its target, checked as a pair;
- :mod:`~agentspec.head.target`: the target model whose hidden states the head reads;
- :mod:`~agentspec.head.drafter`: greedy drafts of a head, as vLLM's eagle3 method drafts.
"""
