"""How each sample of a rollout is drawn: vLLM's sampling options for ``/v1/completions``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SamplingParams"]


class SamplingParams(BaseModel):
    """Sampling of every model turn of a sample.

    ``seed``, when given, is the first sample's; sample ``i`` of a group uses ``seed + i``, so
    the group's samples differ and a rerun draws the same ones.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(256, ge=1, description="Tokens one model turn may generate.")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="-1: no top-k cut.")
    seed: int | None = Field(None, ge=0)
    stop_token_ids: tuple[int, ...] = Field((), description="Token ids that end a turn (besides EOS).")
    logprobs: bool = Field(True, description="Return the log-probability of every generated token.")
    extra: dict[str, Any] = Field(default_factory=dict, description="More vLLM request fields, sent as given.")

    def request_fields(self, sample_index: int) -> dict[str, Any]:
        """The ``/v1/completions`` fields of sample ``sample_index``'s model turns."""
        fields: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
        }
        if self.seed is not None:
            fields["seed"] = self.seed + sample_index
        if self.stop_token_ids:
            fields["stop_token_ids"] = list(self.stop_token_ids)
        if self.logprobs:
            # The sampled token's own log-probability (no alternatives), keyed by token id.
            fields["logprobs"] = 0
            fields["return_tokens_as_token_ids"] = True
        fields.update(self.extra)
        return fields
