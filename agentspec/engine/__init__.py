"""The vLLM engine adapter: a proposer vLLM loads, the plugin wiring it in, session ids
on the wire, a batch-aware draft budget, metrics, and ``agentspec serve``.

Modules:

- :mod:`~agentspec.engine.config`: settings shared by every server process (one env var).
- :mod:`~agentspec.engine.vllm`: everything that imports vLLM: the
  ``vllm.general_plugins`` entry point, the runner's patch, the proposers as vLLM
  subclasses, the launcher, and the table of vLLM's parts agentspec relies on.
- :mod:`~agentspec.engine.drafting`: what the proposers do each step (no vLLM imported).
- :mod:`~agentspec.engine.hybrid_drafting`: the index beside a model drafter (no vLLM).
- :mod:`~agentspec.engine.budget`: how long drafts may be at a given batch size.
- :mod:`~agentspec.engine.middleware`: session ids and seeds on the wire (ASGI).
- :mod:`~agentspec.engine.metrics`: statistics from the worker to the API server.
- :mod:`~agentspec.engine.serve`: ``agentspec serve MODEL [vLLM options]``.

Nothing here is imported by the core (:mod:`agentspec.index`).
"""
