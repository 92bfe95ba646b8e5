"""The vLLM engine adapter, by the process each part runs in.

vLLM runs an API server, an engine core and model workers as separate processes; agentspec
has code in each, and a launcher in the user's shell:

- :mod:`~agentspec.engine.launcher`: ``agentspec serve MODEL [vLLM options]``, whose
  ``--agentspec-*`` options are generated from the settings.
- :mod:`~agentspec.engine.api_server`: the ASGI middleware in vLLM's OpenAI server (auth
  first, agentspec's ``/agentspec/v1/*`` routes, session ids and seeds in request bodies,
  ``/metrics``).
- :mod:`~agentspec.engine.worker`: what the proposers decide each step, beside the model.
- :mod:`~agentspec.engine.vllm`: everything that imports vLLM: the ``vllm.general_plugins``
  entry point, the runner's patch, the proposers as vLLM subclasses, the launch module, and
  the table of vLLM's parts agentspec relies on.
- :mod:`~agentspec.engine.exchange`: finished outputs exchanged between replicas (a folder
  or a Redis stream), run by the workers.

Shared by the processes: :mod:`~agentspec.engine.settings` (one environment variable
carries them to every process), :mod:`~agentspec.engine.snapshots` (statistics from the
workers to the API server), :mod:`~agentspec.engine.tenancy` (who a request belongs to) and
:mod:`~agentspec.engine.exchange_config`.

Nothing here is imported by the core (:mod:`agentspec.index`).
"""
