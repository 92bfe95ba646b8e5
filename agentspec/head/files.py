"""Whether a head folder can draft for a target folder, from their config files alone
(no torch): commands check it before their heavy imports."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["DrafterLoadError", "check_pair"]


class DrafterLoadError(ValueError):
    """The head or its target cannot draft together (a one-line reason)."""


def check_pair(head_dir: Path, target_dir: Path) -> None:
    """One line on why the head in ``head_dir`` cannot draft for ``target_dir``, if so."""
    head_config = head_dir / "config.json"
    target_config = target_dir / "config.json"
    if not head_config.is_file() or not (head_dir / "model.safetensors").is_file():
        raise DrafterLoadError(f"{head_dir} holds no EAGLE-3 head (config.json and model.safetensors)")
    if not target_config.is_file():
        raise DrafterLoadError(f"{target_dir} holds no config.json (a Hugging Face model folder)")
    head = json.loads(head_config.read_text())
    target = json.loads(target_config.read_text())
    if "agentspec" not in head:
        raise DrafterLoadError(f"{head_dir}: not a head written by agentspec train-drafter")
    for key in ("vocab_size", "hidden_size"):
        if head.get(key) != target.get(key):
            raise DrafterLoadError(
                f"the head in {head_dir} was trained for another target: {key} {head.get(key)} vs {target.get(key)}"
            )
    layers = head.get("eagle_aux_hidden_state_layer_ids") or []
    if any(layer >= int(target.get("num_hidden_layers", 0)) for layer in layers):
        raise DrafterLoadError(
            f"the head in {head_dir} reads layers {layers}; {target_dir} has {target.get('num_hidden_layers')}"
        )
