"""The ``agentspec`` speculative method of vLLM's Model Runner V2 (vLLM 0.34 and later).

vLLM 0.34 builds a custom speculator from a registered :class:`SpeculatorConfig`
(``register_speculative_method``, called by :func:`agentspec.engine.vllm.plugin.register`
in every process). This config is vLLM's suffix method's with agentspec's speculator in
its place: it takes the same ``suffix_decoding_*`` options, validated by vLLM, so that
``--speculative-config '{"method": "agentspec", ...}'`` reads as vLLM's own suffix method
does. vLLM asks config modules to stay light (every process imports them): this one
imports only vLLM's suffix config, and names the speculator by its qualified name.
"""

from __future__ import annotations

from typing import ClassVar

from vllm.v1.worker.gpu.spec_decode.suffix.config import SuffixSpeculatorConfig

from agentspec.engine.vllm.surface import V2_METHOD

__all__ = ["V2_METHOD", "AgentspecSpeculatorConfig"]


class AgentspecSpeculatorConfig(SuffixSpeculatorConfig):
    """vLLM's suffix method's options and set-up, agentspec's speculator."""

    speculator_class: ClassVar[str | None] = "agentspec.engine.vllm.speculator.AgentspecSpeculator"
    # The index lives on the host and reads only each step's new tokens from the device
    # (agentspec.engine.vllm.speculator): the full history may stay in host memory.
    prefer_dense_token_history: ClassVar[bool] = False
    # Its drafts' confidences are the index's path probabilities, not draft logits.
    adaptive_verification_uses_draft_logits: ClassVar[bool] = False
