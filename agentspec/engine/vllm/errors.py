"""The error agentspec's vLLM plugin stops a server with."""

from __future__ import annotations


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not one this plugin can wire into."""
