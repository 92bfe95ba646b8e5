"""agentspec's own tests. The server fixtures (``agentspec_server``, ``plain_server``,
``tiny_model_dir``) come from the pytest plugin :mod:`agentspec.testing.pytest_plugin`,
which the repository's root ``conftest.py`` loads."""
