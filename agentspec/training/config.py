"""What ``agentspec train-drafter`` is asked to do: a pydantic model, so the command line,
the Python API and the checkpoint's record of a run are one thing."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DrafterTrainingConfig"]


class DrafterTrainingConfig(BaseModel):
    """An EAGLE-3 head for ``target``, trained on the calls recorded in ``data``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: Path = Field(description="The target model's folder (Hugging Face layout, Llama architecture).")
    data: tuple[Path, ...] = Field(min_length=1, description="Trajectory files (.jsonl[.gz]) of the user's calls.")
    out: Path = Field(description="Folder the head is written to (vLLM's EAGLE-3 layout); checkpoints inside.")
    tenant: str | None = Field(None, description="Train on this tenant's trajectories only (their `tenant` field).")
    all_tenants: bool = Field(False, description="Allow text of several tenants in one drafter.")
    draft_vocab: int = Field(16384, ge=16, description="Tokens the head drafts (the most frequent in the outputs).")
    aux_layers: tuple[int, ...] | None = Field(
        None, description="The target's layers the head reads (default: vLLM's, an early, a middle and a late one)."
    )
    passes: int = Field(3, ge=1, le=8, description="Chained draft passes trained per position (training-time test).")
    steps: int = Field(300, ge=1, description="Optimizer steps.")
    batch_tokens: int = Field(2048, ge=64, description="Tokens per optimizer step.")
    max_tokens: int = Field(512, ge=32, description="Tokens per example (prompt tail and output).")
    context_tokens: int = Field(128, ge=0, description="Prompt tokens kept before each output.")
    learning_rate: float = Field(1e-3, gt=0)
    hard_below: float = Field(
        2.0, gt=0, description="A step is the drafter's when the index expected fewer tokens than this."
    )
    easy_weight: float = Field(0.2, ge=0, description="Loss weight of output tokens the index drafts well.")
    prompt_weight: float = Field(0.1, ge=0, description="Loss weight of prompt tokens.")
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="Share of trajectories held out for evaluation.")
    seed: int = 0
    device: str = Field("cpu", description="Where to train: cpu, or a torch device such as cuda:0.")
    checkpoint_every: int = Field(50, ge=1, description="Steps between checkpoints (resumable).")

    @model_validator(mode="after")
    def _context_fits(self) -> DrafterTrainingConfig:
        if self.context_tokens >= self.max_tokens:
            raise ValueError(f"context_tokens ({self.context_tokens}) must be below max_tokens ({self.max_tokens})")
        return self

    def run_settings(self) -> dict[str, object]:
        """What decides the trained weights (not where they go): a checkpoint resumes only
        under the same."""
        return self.model_dump(mode="json", exclude={"out", "checkpoint_every", "device"})
