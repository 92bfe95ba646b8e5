"""Seeds, and the bounded history a session keeps to re-seed a new backend.

The history holds what the session has put into its backend's draft index: the messages and
outputs of its turns (as ``prior_turn`` seeds) and the seeds the caller gave. When the session
moves to another backend, the history travels with the session's next request, so the new
backend drafts from the session's past as the old one did. It is bounded by a character budget
(text) and a token budget (token ids); the oldest entries go first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentspec.wire import SeedKind, SeedScope

from .errors import InvalidSeedError

__all__ = ["History", "Seed", "SeedKind", "SeedScope", "message_text"]


@dataclasses.dataclass(frozen=True)
class Seed:
    """One entry of ``agentspec_seeds``: exactly one of ``text`` or ``token_ids``."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    kind: SeedKind = SeedKind.PRIOR_TURN
    scope: SeedScope = SeedScope.SESSION

    @classmethod
    def of(
        cls,
        content: str | Sequence[int],
        kind: SeedKind | str = SeedKind.PRIOR_TURN,
        scope: SeedScope | str = SeedScope.SESSION,
    ) -> Seed:
        """Build a validated seed from text or token ids.

        Raises :class:`InvalidSeedError` for empty content, a kind or scope the wire does not
        know, or token ids that are not non-negative ints.
        """
        if kind not in SeedKind._value2member_map_:
            raise InvalidSeedError(f"seed kind must be one of {sorted(SeedKind)}, not {kind!r}")
        if scope not in SeedScope._value2member_map_:
            raise InvalidSeedError(f"seed scope must be one of {sorted(SeedScope)}, not {scope!r}")
        kind, scope = SeedKind(kind), SeedScope(scope)
        if isinstance(content, str):
            if not content:
                raise InvalidSeedError("seed text is empty")
            return cls(text=content, kind=kind, scope=scope)
        ids = tuple(content)
        if not ids:
            raise InvalidSeedError("seed token_ids is empty")
        for t in ids:
            # bool is an int subclass; True as a token id is a bug at the caller.
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise InvalidSeedError(f"seed token_ids must be non-negative ints, got {t!r}")
        return cls(token_ids=ids, kind=kind, scope=scope)

    @property
    def size(self) -> int:
        """Characters of text, or number of token ids."""
        return len(self.text) if self.text is not None else len(self.token_ids or ())

    def to_wire(self) -> dict[str, Any]:
        """The JSON object the server expects in ``agentspec_seeds``."""
        out: dict[str, Any] = {"kind": self.kind.value, "scope": self.scope.value}
        if self.text is not None:
            out["text"] = self.text
        else:
            out["token_ids"] = list(self.token_ids or ())
        return out


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message the model may repeat: its content and tool-call arguments.

    Content given as a list of parts contributes its text parts; images and other parts
    are skipped (a draft index holds text).
    """
    pieces: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                pieces.append(part["text"])
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str):
        pieces.append(reasoning)
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(fn, Mapping):
            name = fn.get("name")
            args = fn.get("arguments")
            if isinstance(name, str):
                pieces.append(name)
            if isinstance(args, str):
                pieces.append(args)
    return "\n".join(p for p in pieces if p)


def _message_key(message: Mapping[str, Any]) -> bytes:
    canonical = json.dumps(message, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.blake2b(canonical.encode("utf-8"), digest_size=16).digest()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class History:
    """A session's bounded record of what its draft index should hold.

    Not thread-safe on its own: a session serialises its calls.
    """

    def __init__(self, max_chars: int, max_tokens: int) -> None:
        self._max_chars = max_chars
        self._max_tokens = max_tokens
        self._entries: deque[Seed] = deque()
        self._chars = 0
        self._tokens = 0
        # Prompts repeat earlier turns' messages; remember which messages were recorded so
        # each is kept once. 16-byte digests: a long session costs kilobytes, not its text.
        self._seen_messages: set[bytes] = set()
        self._last_sequence: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def chars(self) -> int:
        return self._chars

    @property
    def tokens(self) -> int:
        return self._tokens

    def entries(self) -> list[Seed]:
        return list(self._entries)

    def add(self, seed: Seed) -> None:
        """Append ``seed``, trimming it (keeping its tail) when alone over the budget."""
        if seed.text is not None:
            if self._max_chars <= 0:
                return
            if len(seed.text) > self._max_chars:
                seed = dataclasses.replace(seed, text=seed.text[-self._max_chars :])
            self._chars += len(seed.text or "")
        else:
            if self._max_tokens <= 0:
                return
            ids = seed.token_ids or ()
            if len(ids) > self._max_tokens:
                seed = dataclasses.replace(seed, token_ids=ids[-self._max_tokens :])
            self._tokens += len(seed.token_ids or ())
        self._entries.append(seed)
        self._evict()

    def add_chat_turn(self, messages: Iterable[Mapping[str, Any]], output: Mapping[str, Any] | None) -> None:
        """Record a chat turn: the messages not recorded before, then the output."""
        texts: list[str] = []
        for message in messages:
            key = _message_key(message)
            if key in self._seen_messages:
                continue
            self._seen_messages.add(key)
            text = message_text(message)
            if text:
                texts.append(text)
        if output is not None:
            # The output comes back as a message of a later prompt: mark it seen.
            self._seen_messages.add(_message_key(_as_history_message(output)))
            text = message_text(output)
            if text:
                texts.append(text)
        if texts:
            self.add(Seed(text="\n".join(texts)))

    def add_token_turn(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Record a token turn: the prompt's tail past what the last turn covered, then the output."""
        reused = _common_prefix(self._last_sequence, prompt)
        new = tuple(prompt[reused:]) + tuple(output)
        self._last_sequence = tuple(prompt) + tuple(output)
        if new:
            self.add(Seed(token_ids=new))

    def seeds(self, limit: int) -> list[Seed]:
        """The history as at most ``limit`` seeds, oldest first.

        Adjacent entries of the same kind, scope and form are merged (text joined by a
        newline, token ids concatenated) until the count fits; if it still does not, the
        oldest entries are dropped.
        """
        if limit <= 0:
            return []
        entries = list(self._entries)
        while len(entries) > limit:
            for i in range(len(entries) - 1):
                a, b = entries[i], entries[i + 1]
                if (a.kind, a.scope, a.text is None) == (b.kind, b.scope, b.text is None):
                    entries[i : i + 2] = [_merge(a, b)]
                    break
            else:
                entries.pop(0)
        return entries

    def _evict(self) -> None:
        while self._chars > self._max_chars or self._tokens > self._max_tokens:
            old = self._entries.popleft()
            if old.text is not None:
                self._chars -= len(old.text)
            else:
                self._tokens -= len(old.token_ids or ())


def _merge(a: Seed, b: Seed) -> Seed:
    if a.text is not None and b.text is not None:
        return dataclasses.replace(a, text=a.text + "\n" + b.text)
    return dataclasses.replace(a, token_ids=(a.token_ids or ()) + (b.token_ids or ()))


def _as_history_message(output: Mapping[str, Any]) -> dict[str, Any]:
    """The shape an assistant output usually has when a caller sends it back as history."""
    msg: dict[str, Any] = {"role": output.get("role", "assistant"), "content": output.get("content")}
    if output.get("tool_calls"):
        msg["tool_calls"] = output["tool_calls"]
    return msg
