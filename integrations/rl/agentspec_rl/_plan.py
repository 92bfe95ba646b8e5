"""Checking what a rollout asks for before anything is sent: one place for both clients."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from agentspec import wire

__all__ = ["GroupPlan", "plan_groups", "sample_session_id"]


@dataclass(frozen=True, slots=True)
class GroupPlan:
    group_id: str
    prompt: tuple[int, ...]
    n: int


def sample_session_id(group_id: str, index: int) -> str:
    """Sample ``index`` of a group is its own session, in the group: ``<group>/<index>``.

    Group ids leave room for the suffix (at most 118 characters)."""
    return f"{group_id}/{index}"


def _prompt(raw: Sequence[int], where: str) -> tuple[int, ...]:
    if isinstance(raw, str | bytes):
        # ValueError like every other check of a prompt (not TypeError): callers catch one.
        raise ValueError(f"{where}: a prompt is token ids, not text (tokenize it with the policy's tokenizer)")  # noqa: TRY004
    ids = tuple(raw)
    if not ids:
        raise ValueError(f"{where}: the prompt is empty")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ValueError(f"{where}: prompt token ids must be non-negative integers")
    return ids


def plan_groups(prompts: Sequence[Sequence[int]], n: int, group_ids: Sequence[str] | None) -> list[GroupPlan]:
    """Validated groups: ``n`` samples of each prompt. Raises ``ValueError`` naming the
    problem: an empty or non-token prompt, ``n`` < 1, a bad group id, or one group id given
    for two prompts (a group is n samples of *one* prompt)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if group_ids is not None and len(group_ids) != len(prompts):
        raise ValueError(f"{len(group_ids)} group ids for {len(prompts)} prompts")
    plans: list[GroupPlan] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(prompts):
        prompt = _prompt(raw, f"prompt {i}")
        group_id = group_ids[i] if group_ids is not None else f"grp-{uuid.uuid4().hex[:16]}"
        if not wire.is_valid_id(group_id) or len(group_id) > 118:
            raise ValueError(f"group id {group_id!r} must be 1 to 118 characters of letters, digits and . _ : @ / -")
        if group_id in seen:
            first = seen[group_id]
            what = "the same prompt twice" if plans[first].prompt == prompt else "two different prompts"
            raise ValueError(
                f"group {group_id!r} is given {what} (prompts {first} and {i}); a group is n samples of one prompt"
            )
        seen[group_id] = i
        plans.append(GroupPlan(group_id, prompt, n))
    return plans
