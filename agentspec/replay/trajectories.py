"""Recorded trajectories: loading, context expansion, sessions and groups, windows.

The data format (one JSON object per line, optionally gzip-compressed) is
documented in ``docs/bench.md``. A turn is one LLM call. To keep files small a
turn may carry ``prefix_len`` + ``messages_in_delta`` instead of the whole
``messages_in``; :func:`expand_turns` restores every context exactly.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["agent", "samples", "refine"]

#: Role of a message that holds raw prompt text (no chat template applies).
RAW_PROMPT_ROLE = "prompt"


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class Turn:
    """One recorded LLM call: the whole context sent and the text answered."""

    messages: tuple[Message, ...]
    output: str


@dataclass(frozen=True, slots=True)
class Trajectory:
    id: str
    source: str
    task: str
    kind: Kind
    model: str
    turns: tuple[Turn, ...]

    @property
    def group_id(self) -> str:
        """Sessions expected to write alike.

        A ``samples`` trajectory is itself one group of sibling samples; agent and
        refine trajectories of the same task (e.g. tau-bench trials) form a group.
        """
        if self.kind == "samples":
            return self.id
        return f"{self.source}/{self.task}"

    def session_id(self, turn: int) -> str:
        """Every sibling sample is its own session; an agent trajectory is one."""
        if self.kind == "samples":
            return f"{self.id}/{turn}"
        return self.id


class DataFormatError(ValueError):
    """A line of the data file does not follow the trajectory format."""


def _messages(raw: Sequence[dict[str, Any]]) -> tuple[Message, ...]:
    return tuple(Message(str(m["role"]), str(m["content"])) for m in raw)


def expand_turns(raw_turns: Sequence[dict[str, Any]]) -> tuple[Turn, ...]:
    """Restore the full ``messages_in`` of every turn.

    A compact turn means ``previous turn's messages_in[:prefix_len] + messages_in_delta``.
    """
    turns: list[Turn] = []
    previous: tuple[Message, ...] = ()
    for i, raw in enumerate(raw_turns):
        if "messages_in" in raw:
            messages = _messages(raw["messages_in"])
        elif "prefix_len" in raw:
            n = int(raw["prefix_len"])
            if not 0 <= n <= len(previous):
                raise DataFormatError(
                    f"turn {i}: prefix_len {n} outside the previous context ({len(previous)} messages)"
                )
            messages = previous[:n] + _messages(raw.get("messages_in_delta", ()))
        else:
            raise DataFormatError(f"turn {i}: neither messages_in nor prefix_len")
        turns.append(Turn(messages, str(raw["output"])))
        previous = messages
    return tuple(turns)


def parse_trajectory(obj: dict[str, Any]) -> Trajectory:
    """One trajectory from its JSON object; :class:`DataFormatError` saying what is wrong."""
    if not isinstance(obj, dict):
        raise DataFormatError(f"a trajectory is a JSON object, got {type(obj).__name__}")
    try:
        kind = obj["kind"]
        if kind not in ("agent", "samples", "refine"):
            raise DataFormatError(f"unknown kind {kind!r}")
        if not isinstance(obj["turns"], list) or not obj["turns"]:
            raise DataFormatError(f"trajectory {obj.get('id')!r} has no turns")
        return Trajectory(
            id=str(obj["id"]),
            source=str(obj["source"]),
            task=str(obj.get("task", obj["id"])),
            kind=kind,
            model=str(obj.get("model", "")),
            turns=expand_turns(obj["turns"]),
        )
    except KeyError as e:
        raise DataFormatError(f"trajectory {obj.get('id')!r}: missing field {e}") from e
    except (TypeError, AttributeError, ValueError) as e:
        if isinstance(e, DataFormatError):
            raise
        raise DataFormatError(f"trajectory {obj.get('id')!r}: malformed turns ({e})") from e


def _open_text(path: Path) -> io.TextIOBase:
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")  # type: ignore[return-value]
    return open(path, encoding="utf-8")


def iter_raw(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the raw JSON objects of a ``.jsonl`` or ``.jsonl.gz`` file."""
    for _, obj in iter_numbered(path):
        yield obj


def iter_numbered(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of each trajectory line; :class:`DataFormatError` naming the
    file and line for one that is not JSON, not an object, or has no ``source``."""
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                raise DataFormatError(f"{path.name}:{lineno}: not JSON ({e})") from e
            if not isinstance(obj, dict):
                raise DataFormatError(f"{path.name}:{lineno}: a trajectory is a JSON object, got {type(obj).__name__}")
            if not isinstance(obj.get("source"), str):
                raise DataFormatError(f"{path.name}:{lineno}: trajectory {obj.get('id')!r} names no source")
            yield lineno, obj


def load_trajectories(path: Path, sources: Sequence[str] | None = None) -> dict[str, list[Trajectory]]:
    """Trajectories by source, in file order. ``sources`` filters (None = all)."""
    wanted = set(sources) if sources else None
    out: dict[str, list[Trajectory]] = {}
    for lineno, obj in iter_numbered(path):
        if wanted is not None and obj.get("source") not in wanted:
            continue
        try:
            t = parse_trajectory(obj)
        except DataFormatError as e:
            raise DataFormatError(f"{path.name}:{lineno}: {e}") from e
        out.setdefault(t.source, []).append(t)
    return out


def raw_window(length: int, window: int | None) -> tuple[int, int] | None:
    """The span a condenser cuts from a raw prompt (text without messages), or None.

    A raw prompt has no messages to drop, so the emulation works on tokens: it keeps the
    first ``window // 2`` tokens (the agent's instructions and task) and the most recent
    ones up to ``window`` in all, and drops the middle ``[start, end)``.
    """
    if window is None or length <= window:
        return None
    head = window // 2
    return head, length - (window - head)


def select_window(roles: Sequence[str], lengths: Sequence[int], window: int | None, reserve: int = 0) -> list[int]:
    """Indices of the messages a context condenser keeps, in order.

    Emulates the common condenser policy: keep the system message and the first
    user message (the task), then the most recent messages that fit, so that the
    kept messages plus ``reserve`` (the generation header) total at most
    ``window`` tokens. The head is kept even when it alone exceeds the window.
    Recent messages are taken newest first and stop at the first one that does
    not fit: a condenser drops a contiguous middle, it does not cherry-pick.
    """
    n = len(roles)
    if window is None or sum(lengths) + reserve <= window:
        return list(range(n))
    head: list[int] = []
    for role in ("system", "user"):
        i = next((j for j, r in enumerate(roles) if r == role), None)
        if i is not None and i not in head:
            head.append(i)
    if not head:
        # Raw prompts have no structure to condense: keep them whole.
        return list(range(n))
    budget = window - reserve - sum(lengths[i] for i in head)
    tail: list[int] = []
    floor = max(head)
    for j in range(n - 1, floor, -1):
        if lengths[j] > budget:
            break
        budget -= lengths[j]
        tail.append(j)
    return sorted(head) + tail[::-1]
