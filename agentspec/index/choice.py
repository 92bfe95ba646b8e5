"""Choosing one draft among the levels' candidates.

At every step each level whose tree matches the context offers a draft. The index keeps the
one with the highest calibrated score (:func:`by_calibrated_score`: the tree's expected
accepted tokens, weighed by how well that level's estimates have held up). Another rule can
be given to :class:`~agentspec.index.DraftIndex` as a :class:`DraftChooser`, e.g. a model
fitted offline (``SurvivalChooser`` in ``benchmarks/survival_chooser.py``); it sees what the
default rule sees plus where the call stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from agentspec.index.corpus import TreeDraft
from agentspec.index.types import Level

__all__ = ["Candidate", "ChoiceContext", "DraftChooser", "by_calibrated_score"]


class Candidate(NamedTuple):
    """One level's draft for the step, and that level's calibration weight (1.0: none).

    A tuple because the index makes one per level at every decoding step."""

    draft: TreeDraft
    level: Level
    weight: float


class ChoiceContext(NamedTuple):
    """Where the call stands when it drafts."""

    #: Output tokens the call has produced so far.
    position: int
    #: The call's previous verified draft: its length and the tokens accepted (0, 0: none).
    last_drafted: int
    last_accepted: int


class DraftChooser(Protocol):
    """Picks the draft to send: an index into ``candidates`` (most specific level first, none
    of them empty), or -1 for no draft."""

    def choose(self, candidates: Sequence[Candidate], context: ChoiceContext) -> int: ...


def by_calibrated_score(candidates: Sequence[Candidate]) -> int:
    """The index's default: the highest score times level weight; ties go to the more
    specific level (listed first). (The index applies it inline, without making candidates.)"""
    best, best_score = -1, 0.0
    for i, c in enumerate(candidates):
        score = c.draft.score * c.weight
        if best < 0 or score > best_score:
            best, best_score = i, score
    return best
