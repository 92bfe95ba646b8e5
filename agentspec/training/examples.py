"""Training text for the drafter: recorded calls, tokenized as the target sees them, each
output token weighted by whether the draft index could draft it.

A call becomes one example: the tail of its prompt (``context_tokens``) and its output,
rendered with the target's chat template. Output tokens decoded on a step where the index
expected fewer than ``hard_below`` tokens (it had no confident draft: the model drafter's
steps under the hybrid) weigh 1; the others weigh ``easy_weight``; prompt tokens
``prompt_weight``. The index runs exactly as the server runs it on those calls: one
session per trajectory (a sample's own session in its group), greedy verification of its
drafts against the recorded output.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentspec.replay.trajectories import (
    RAW_PROMPT_ROLE,
    DataFormatError,
    Trajectory,
    iter_numbered,
    parse_trajectory,
)

__all__ = ["Example", "TenantTrajectories", "index_hard_steps", "load_corpus", "tokenize_calls"]


@dataclass
class Example:
    """One call: token ids and a loss weight per token (the weight of predicting it)."""

    ids: list[int]
    weights: list[float]
    trajectory: str
    hard: list[bool] = field(default_factory=list)  # per output token
    output_start: int = 0
    hard_tokens: int = 0
    output_tokens: int = 0


@dataclass
class TenantTrajectories:
    """Trajectories read from the training files, with the tenants they came from."""

    trajectories: list[Trajectory] = field(default_factory=list)
    tenants: set[str] = field(default_factory=set)


def load_corpus(paths: Sequence[Path], tenant: str | None, all_tenants: bool) -> TenantTrajectories:
    """Trajectories from ``paths`` (our trajectory format, with an optional ``tenant``
    field; none means the default tenant ``""``).

    A drafter trained on several tenants' text drafts it for all of them, so text of more
    than one tenant is refused unless ``tenant`` picks one or ``all_tenants`` says so.
    """
    found = TenantTrajectories()
    by_tenant: dict[str, list[Trajectory]] = {}
    for path in paths:
        for lineno, obj in iter_numbered(path):
            owner = obj.get("tenant", "")
            if not isinstance(owner, str):
                raise DataFormatError(f"{path.name}:{lineno}: tenant must be a string, got {owner!r}")
            try:
                trajectory = parse_trajectory(obj)
            except DataFormatError as e:
                raise DataFormatError(f"{path.name}:{lineno}: {e}") from e
            by_tenant.setdefault(owner, []).append(trajectory)
    if tenant is not None:
        chosen = {tenant: by_tenant.get(tenant, [])}
    elif len(by_tenant) > 1 and not all_tenants:
        names = ", ".join(repr(t) for t in sorted(by_tenant))
        raise DataFormatError(
            f"the training text holds {len(by_tenant)} tenants ({names}): a drafter trained on it drafts"
            " every tenant's text for all of them; pick one with --tenant, or pass --all-tenants"
        )
    else:
        chosen = by_tenant
    for owner, trajectories in chosen.items():
        if trajectories:
            found.tenants.add(owner)
            found.trajectories.extend(trajectories)
    return found


def _render(tokenizer: Any, messages: Sequence[Any]) -> list[int]:
    """The prompt's ids: the chat template with a generation prompt, or raw prompt text."""
    if any(m.role == RAW_PROMPT_ROLE for m in messages):
        text = "".join(m.content for m in messages)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    chat = [{"role": m.role, "content": m.content} for m in messages]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def tokenize_calls(tokenizer: Any, trajectory: Trajectory) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, output ids)`` of each call; the output ends with the end-of-turn token
    the target would emit (the tokenizer's eos)."""
    calls = []
    eos = tokenizer.eos_token_id
    for turn in trajectory.turns:
        prompt = _render(tokenizer, turn.messages)
        output = list(tokenizer(turn.output, add_special_tokens=False)["input_ids"])
        if eos is not None:
            output.append(int(eos))
        calls.append((prompt, output))
    return calls


def index_hard_steps(
    trajectories: Iterable[tuple[Trajectory, list[tuple[list[int], list[int]]]]], hard_below: float
) -> dict[tuple[str, int], list[bool]]:
    """Per call ``(trajectory id, turn)``: for each output token, whether the step that decoded
    it had no index draft expected to deliver ``hard_below`` tokens (index-only decoding)."""
    from agentspec.index import DraftIndex

    index = DraftIndex()
    hard: dict[tuple[str, int], list[bool]] = {}
    for trajectory, calls in trajectories:
        for turn, (prompt, output) in enumerate(calls):
            call_id = (trajectory.id, turn)
            index.start_call(
                call_id,
                prompt,
                session_id=trajectory.session_id(turn),
                group_id=trajectory.group_id,
            )
            flags: list[bool] = []
            position = 0
            while position < len(output):
                draft = index.propose(call_id)
                expected = index.expected_accepted(draft)
                accepted = 0
                for token, want in zip(draft.token_ids, output[position:], strict=False):
                    if token != want:
                        break
                    accepted += 1
                index.record_verification(call_id, len(draft.token_ids), accepted)
                step = output[position : position + accepted + 1]
                flags.extend([expected < hard_below] * len(step))
                index.extend_call(call_id, step)
                position += len(step)
            index.finish_call(call_id)
            hard[call_id] = flags
    return hard


def build_examples(
    calls: Sequence[tuple[Trajectory, list[tuple[list[int], list[int]]]]],
    hard: dict[tuple[str, int], list[bool]],
    *,
    context_tokens: int,
    max_tokens: int,
    easy_weight: float,
    prompt_weight: float,
) -> list[Example]:
    """One example per call (see the module doc); outputs longer than ``max_tokens`` less
    the context are cut into several, each after its own context."""
    examples = []
    for trajectory, tokenized in calls:
        for turn, (prompt, output) in enumerate(tokenized):
            flags = hard[(trajectory.id, turn)]
            weights = [1.0 if f else easy_weight for f in flags]
            room = max(1, max_tokens - context_tokens)
            text = prompt + output
            start_of_output = len(prompt)
            for cut in range(0, len(output), room):
                begin = max(0, start_of_output + cut - context_tokens)
                end = start_of_output + min(len(output), cut + room)
                ids = text[begin:end]
                w = [prompt_weight] * (start_of_output + cut - begin) + weights[cut : cut + room]
                piece_flags = flags[cut : cut + room]
                examples.append(
                    Example(
                        ids=ids,
                        weights=w,
                        trajectory=trajectory.id,
                        output_start=start_of_output + cut - begin,
                        hard=piece_flags,
                        hard_tokens=sum(piece_flags),
                        output_tokens=len(piece_flags),
                    )
                )
    return examples
