"""How well a head drafts held-out calls, against the target's own greedy choices.

For each output token of the held-out examples, pass ``k`` of the head (chained as vLLM
chains it) drafts the token; it is accepted when it equals the target's greedy choice
there. A chain of ``passes`` drafts starting at an output position delivers the drafts up
to the first miss; it can continue past a token only where the recorded text is the
target's greedy choice (on text the target wrote greedily, always; on other models' text,
this measures agreement with the target along that text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentspec.head.eagle3 import Eagle3Head
from agentspec.head.target import TargetModel
from agentspec.training.examples import Example

__all__ = ["HeldOutScore", "score_head"]


@dataclass
class HeldOutScore:
    """Acceptance of a head's drafts on held-out output tokens."""

    tokens: int
    hard_tokens: int
    #: Per pass: the share of output tokens its draft got right.
    acceptance: list[float]
    #: The first pass's acceptance on the steps the index could not draft.
    hard_acceptance: float
    #: Mean drafts accepted in a chain of ``passes`` (greedy verification).
    chain_accepted: float


@torch.no_grad()
def score_head(
    head: Eagle3Head, target: TargetModel, examples: Sequence[Example], passes: int, limit: int = 64
) -> HeldOutScore:
    """Score ``head`` on the first ``limit`` of ``examples`` (see the module doc)."""
    head.eval()
    hits = [0] * passes
    counted = [0] * passes
    hard_hits = hard_count = chains = chain_total = 0
    for example in list(examples)[:limit]:
        ids = torch.tensor([example.ids])
        seen = target.run(ids, head.shape.aux_layers, head.draft_ids, greedy=True)
        logits = head.unrolled(seen.aux_states, seen.next_embeds, seen.cos, seen.sin, passes)
        assert seen.greedy is not None
        greedy = seen.greedy[0].cpu().tolist()
        drafted = [head.draft_ids[pass_logits[0].argmax(-1)].cpu().tolist() for pass_logits in logits]
        n = len(example.ids)
        hard = example.hard
        # Token m (an output token) is drafted at position q = m - 2, as the target chose it at m - 1.
        right = [[False] * n for _ in range(passes)]
        for k in range(passes):
            for m in range(max(example.output_start, k + 2), n):
                ok = drafted[k][m - 2] == greedy[m - 1]
                right[k][m] = ok
                hits[k] += ok
                counted[k] += 1
                if k == 0 and hard and hard[m - example.output_start]:
                    hard_hits += ok
                    hard_count += 1
        follows = [m >= 1 and example.ids[m] == greedy[m - 1] for m in range(n)]
        for start in range(max(example.output_start, passes + 1), n):
            accepted = 0
            for k in range(passes):
                m = start + k
                if m >= n or not right[k][m]:
                    break
                accepted += 1
                if not follows[m]:
                    break  # the text leaves the target's choice: no later draft is comparable
            chains += 1
            chain_total += accepted
    head.train()
    return HeldOutScore(
        tokens=counted[0],
        hard_tokens=hard_count,
        acceptance=[h / c if c else 0.0 for h, c in zip(hits, counted, strict=True)],
        hard_acceptance=hard_hits / hard_count if hard_count else 0.0,
        chain_accepted=chain_total / chains if chains else 0.0,
    )
