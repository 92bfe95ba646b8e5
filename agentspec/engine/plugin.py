"""Moved to :mod:`agentspec.engine.vllm.plugin`; this name is kept for a release, for
entry points and settings written against it."""

from agentspec.engine.vllm.plugin import SUPPORTED_VLLM_SERIES, UnsupportedVLLMError, register

__all__ = ["SUPPORTED_VLLM_SERIES", "UnsupportedVLLMError", "register"]
