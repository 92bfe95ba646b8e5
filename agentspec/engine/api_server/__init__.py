"""What runs in vLLM's API-server processes: the ASGI middleware vLLM loads
(:mod:`~agentspec.engine.api_server.middleware`), which checks vLLM's API key first
(:mod:`~agentspec.engine.api_server.auth`), serves agentspec's routes
(:mod:`~agentspec.engine.api_server.control_plane`), rewrites generation bodies with
session ids and seeds (:mod:`~agentspec.engine.api_server.seeds`), and adds agentspec's
series to ``/metrics`` (:mod:`~agentspec.engine.api_server.prometheus`)."""
