"""The vLLM engine adapter: a proposer vLLM loads, the plugin wiring it in, session ids
on the wire, a batch-aware draft budget, metrics, and ``agentspec serve``.

Modules:

- :mod:`~agentspec.engine.config`: settings shared by every server process (one env var).
- :mod:`~agentspec.engine.plugin`: the ``vllm.general_plugins`` entry point; it patches
  vLLM's model runner and checks the runner its workers build.
- :mod:`~agentspec.engine.vllm_surface`: every part of vLLM agentspec relies on, in one
  table, and the checks of it against an installed vLLM or a release's files.
- :mod:`~agentspec.engine.proposer`: the proposer vLLM calls each step.
- :mod:`~agentspec.engine.budget`: how long drafts may be at a given batch size.
- :mod:`~agentspec.engine.middleware`: session ids and seeds on the wire (ASGI).
- :mod:`~agentspec.engine.metrics`: statistics from the worker to the API server.
- :mod:`~agentspec.engine.serve`: ``agentspec serve MODEL [vLLM options]``.

Nothing here is imported by the core (:mod:`agentspec.index`).
"""
