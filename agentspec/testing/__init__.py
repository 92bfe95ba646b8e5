"""Test support shared by agentspec's own test suites and by integrations' tests.

- :mod:`agentspec.testing.tiny_model`: builds a tiny, deterministic Llama model with a
  locally trained byte-level BPE tokenizer, so server tests need no model hub.
- :mod:`agentspec.testing.server`: starts a real vLLM OpenAI server (with or without the
  agentspec plugin) on a free port and stops it again.
- :mod:`agentspec.testing.stub`: a stub OpenAI-compatible server (real HTTP, instant
  answers, agentspec's id and seed checks, injectable failures) for client tests.
- :mod:`agentspec.testing.pytest_plugin`: pytest fixtures with those servers; opt-in,
  with ``pytest -p agentspec.testing.pytest_plugin`` or ``pytest_plugins =
  ["agentspec.testing.pytest_plugin"]`` in a root ``conftest.py``.

The stub server needs the ``stub`` extra (starlette, uvicorn; ``test`` includes it); the
tiny model and the real servers need vLLM (the ``serve`` or ``cpu`` extra).
"""
