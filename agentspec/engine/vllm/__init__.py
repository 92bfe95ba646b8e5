"""Everything of agentspec that imports vLLM, one module per part of vLLM it touches.

- :mod:`~agentspec.engine.vllm.surface`: the table of vLLM's parts agentspec relies on,
  with the checks of it against an installed vLLM or a release's files;
- :mod:`~agentspec.engine.vllm.plugin`: the ``vllm.general_plugins`` entry point;
- :mod:`~agentspec.engine.vllm.runner`: the patch of the V1 model runner (vLLM 0.32, 0.33);
- :mod:`~agentspec.engine.vllm.speculator_config`, :mod:`~agentspec.engine.vllm.speculator`
  and :mod:`~agentspec.engine.vllm.runner_v2`: the ``agentspec`` method on Model Runner V2
  (vLLM 0.34): its registered config, the speculator, and the runner's one wrap;
- :mod:`~agentspec.engine.vllm.workers`: the workers' check of the runner they built;
- :mod:`~agentspec.engine.vllm.proposers`: agentspec's proposers as vLLM subclasses;
- :mod:`~agentspec.engine.vllm.fixes`: the CPU backend's rejection-sampler fix;
- :mod:`~agentspec.engine.vllm.launch` and :mod:`~agentspec.engine.vllm.args`: vLLM's
  ``serve`` command and its options' parser;
- :mod:`~agentspec.engine.vllm.import_hook`, :mod:`~agentspec.engine.vllm.errors`.

Outside this package, agentspec reaches vLLM only through
:func:`agentspec.engine.vllm.surface.load` (the API server's authentication and
tokenizer); a test holds this. Importing the package imports no vLLM.
"""
