"""The target model as the head's teacher: its hidden states, rotary tables, embeddings and
its next-token distribution over the draft vocabulary, from one forward pass without grad."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["TargetModel", "TargetPass", "default_aux_layers"]


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """vLLM's default EAGLE-3 layers for a Llama target: an early, a middle and a late one."""
    return tuple(sorted({2, num_layers // 2, num_layers - 3}))


@dataclass
class TargetPass:
    """What one forward pass of the target gives the head, for a batch [B, T]."""

    aux_states: torch.Tensor  # [B, T, layers x hidden]
    next_embeds: torch.Tensor  # [B, T, hidden]: the embedding of the token at q + 1
    cos: torch.Tensor
    sin: torch.Tensor
    draft_logits: torch.Tensor  # [B, T, draft vocab]: the target's logits at q
    greedy: torch.Tensor | None = None  # [B, T]: the target's own choice at q (full vocabulary)


class TargetModel:
    """A Hugging Face causal LM folder (Llama architecture), loaded in fp32 on ``device``."""

    def __init__(self, folder: Path, device: str = "cpu") -> None:
        from transformers import AutoModelForCausalLM

        self.folder = folder
        self.device = torch.device(device)
        self.model: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(self.device)
        self.model.eval()
        self.model.requires_grad_(False)
        self.config: Any = self.model.config

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)  # type: ignore[no-any-return]

    def output_weight(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight  # type: ignore[no-any-return]

    @torch.no_grad()
    def run(
        self, ids: torch.Tensor, aux_layers: tuple[int, ...], draft_ids: torch.Tensor, greedy: bool = False
    ) -> TargetPass:
        """The target on ``ids`` [B, T] (right-padded rows are fine: attention is causal);
        ``greedy`` adds its argmax over the whole vocabulary."""
        ids = ids.to(self.device)
        base = self.model.get_decoder()
        out = base(input_ids=ids, output_hidden_states=True, use_cache=False)
        # hidden_states[i] is the input of layer i: vLLM's aux state of layer id i.
        aux = torch.cat([out.hidden_states[i] for i in aux_layers], dim=-1)
        logits = out.last_hidden_state @ self.output_weight()[draft_ids].T
        positions = torch.arange(ids.shape[1], device=self.device).unsqueeze(0).expand(ids.shape[0], -1)
        cos, sin = base.rotary_emb(out.last_hidden_state, positions)
        next_ids = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
        choice = (out.last_hidden_state @ self.output_weight().T).argmax(-1) if greedy else None
        return TargetPass(aux, self.embed(next_ids), cos, sin, logits, choice)
