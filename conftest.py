"""Repository-wide pytest set-up: agentspec's server fixtures (``tiny_model_dir``,
``agentspec_server``, ``agentspec_peer_server``, ``plain_server``) for every suite here,
the integrations' included. The plugin is opt-in for everyone else (``-p
agentspec.testing.pytest_plugin``); pytest honours ``pytest_plugins`` only in this, the
root, conftest. Importing it imports neither vLLM nor the draft index."""

pytest_plugins = ["agentspec.testing.pytest_plugin", "pytester"]
