"""agentspec's proposers as vLLM's model runner builds them: vLLM's proposer classes with
agentspec's drafting mixed in before them.

The plugin puts these in place of the runner module's ``SuffixDecodingProposer``,
``DraftModelProposer`` and ``EagleProposer`` (:mod:`agentspec.engine.vllm.runner`). They
hold no logic of their own beyond construction and the calls into vLLM's model drafter:
the drafting is :mod:`agentspec.engine.worker.drafting`'s and :mod:`agentspec.engine.worker.hybrid_drafting`'s.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.config.vllm import VllmConfig
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

from agentspec.engine.settings import EngineSettings
from agentspec.engine.worker.drafting import SuffixDrafting
from agentspec.engine.worker.hybrid_drafting import HybridDrafting

__all__ = ["AgentspecProposer", "HybridEagleProposer", "HybridProposer"]


class AgentspecProposer(SuffixDrafting, SuffixDecodingProposer):
    """Session-aware suffix drafting with the interface of vLLM's suffix proposer.

    The parent's constructor is deliberately not called: it builds arctic-inference's
    ``SuffixDecodingCache``, which :class:`~agentspec.index.DraftIndex` replaces.
    """

    def __init__(self, vllm_config: VllmConfig, settings: EngineSettings | None = None) -> None:
        self._init_session_drafting(vllm_config, settings)


class _VllmModelDrafter(HybridDrafting):
    """The hybrid on one of vLLM's model-drafter proposers (``_vllm_proposer``): built as
    that proposer, then the index beside it; the hybrid's calls into its passes."""

    #: The vLLM proposer class this one extends (the next base class of the subclass).
    _vllm_proposer: ClassVar[type[SpecDecodeBaseProposer]]

    def __init__(
        self,
        vllm_config: VllmConfig,
        device: torch.device,
        runner: Any = None,
        settings: EngineSettings | None = None,
    ) -> None:
        self._vllm_proposer.__init__(self, vllm_config, device, runner)
        self._init_hybrid(vllm_config, settings)

    def _run_model_drafter(self, num_speculative_tokens: int, **kwargs: Any) -> torch.Tensor:
        return SpecDecodeBaseProposer.propose(self, num_speculative_tokens=num_speculative_tokens, **kwargs)  # type: ignore[arg-type]

    def _model_draft_probs(self) -> torch.Tensor | None:
        return self._last_draft_probs  # type: ignore[attr-defined, no-any-return]


class HybridProposer(_VllmModelDrafter, DraftModelProposer):
    """vLLM's draft-model proposer (``method: draft_model``) with the index beside it."""

    _vllm_proposer = DraftModelProposer


class HybridEagleProposer(_VllmModelDrafter, EagleProposer):
    """vLLM's EAGLE proposer (``method: eagle`` / ``eagle3``) with the index beside it."""

    _vllm_proposer = EagleProposer
