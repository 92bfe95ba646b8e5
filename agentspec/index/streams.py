"""A session's streams: which earlier context a new prompt continues, and what of it to index.

A *stream* is one context of a session as its calls saw it: a call's prompt followed by
what the call produced. Each stream is one sequence of the session's call-text tree (a
:class:`~agentspec.index.corpus.Corpus`); its tokens are kept beside the tree, so that the next
prompt can be compared with them. :func:`attach_stream` handles the three ways a prompt
relates to what the session holds:

- It extends a stream (the usual agent turn: call N+1 sends call N's prompt and output plus
  new messages). That stream is extended in place; only the new tail is indexed.
- A condensed history: the prompt keeps the session's start and its most recent turns and
  drops turns in between. The recent turns are the end of an earlier stream, which the tree
  holds, so only the seam where they now start and the new text are indexed.
- Anything else that diverges (a summary replacing turns, an output rendered differently, a
  concurrent call of the same session): a new stream, indexed from ``max_depth`` tokens
  before the divergence.

In the last two cases the old streams stay in the tree and stay draftable; every piece
indexed repeats ``max_depth`` tokens before its start, so every substring the tree can match
across a seam is indexed.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from agentspec.index.corpus import Corpus
from agentspec.index.tokens import TokenBuffer, find_last
from agentspec.index.types import CallStart

__all__ = ["STREAMS_COMPARED", "Stream", "attach_stream", "condensed_resume"]

#: How many of a session's most recent streams a new prompt is compared with.
STREAMS_COMPARED = 4


@dataclass(slots=True, eq=False)
class Stream:
    """One context of a session: its sequence in the session's call-text tree and the full
    token sequence it stands for (the tree may hold less of it: see :func:`attach_stream`)."""

    seq_id: int
    tokens: TokenBuffer
    writer: Hashable | None = None  # the active call appending to it


def attach_stream(streams: list[Stream], tree: Corpus, prompt: np.ndarray, max_depth: int) -> tuple[Stream, CallStart]:
    """Find the stream in ``streams`` (most recently used last) that ``prompt`` continues,
    or start one, and index in ``tree`` what it does not hold yet.

    Returns the stream, now the most recently used, and what was indexed: ``new_tokens`` is
    the number of tokens added to ``tree``.
    """
    best: Stream | None = None
    best_len = 0
    for stream in streams[-STREAMS_COMPARED:]:
        n = stream.tokens.common_prefix_len(prompt)
        # Prefer an idle stream on equal overlap: it can be extended in place.
        if n > best_len or (n == best_len and best is not None and best.writer is not None):
            best, best_len = stream, n
    if best is not None and best.writer is None and best_len == len(best.tokens):
        # The usual agent turn: the prompt extends what the session already holds.
        tail = prompt[best_len:]
        best.tokens.append(tail)
        streams.remove(best)
        streams.append(best)
        new = tree.extend(best.seq_id, tail)
        return best, CallStart(new_tokens=new, reused_tokens=best_len, rewritten=False)
    # The prompt diverges from every stream (history rewritten, output re-rendered, or a
    # concurrent call of the same session). Start a new sequence that repeats ``max_depth``
    # tokens before the divergence; the old text stays draftable.
    stream = Stream(tree.new_sequence(), TokenBuffer(prompt))
    streams.append(stream)
    resume = condensed_resume(best, prompt, best_len, max_depth) if best is not None else None
    if resume is None:
        new = tree.extend(stream.seq_id, prompt[max(0, best_len - max_depth) :])
        return stream, CallStart(new_tokens=new, reused_tokens=best_len, rewritten=True)
    # A condenser dropped turns from the middle: prompt[best_len:resume] is the end of the
    # old stream, which the tree holds. Index only the seam where it now starts and what
    # follows it (each with ``max_depth`` tokens of overlap).
    seam = tree.new_sequence()
    new = tree.extend(seam, prompt[max(0, best_len - max_depth) : best_len + max_depth])
    new += tree.extend(stream.seq_id, prompt[resume - max_depth :])
    return stream, CallStart(new_tokens=new, reused_tokens=best_len, rewritten=True)


def condensed_resume(old: Stream, prompt: np.ndarray, diverged: int, max_depth: int) -> int | None:
    """Where in ``prompt`` the old stream's text ends, if what comes between the divergence
    and there is the old stream's own end (turns dropped from the middle, the recent ones
    kept); None otherwise or when that saves too little to matter."""
    held = old.tokens.view()
    probe_len = min(max_depth, len(held))
    if probe_len == 0:
        return None
    at = find_last(prompt, held[len(held) - probe_len :], start=diverged)
    if at < 0:
        return None
    resume = at + probe_len
    span = resume - diverged
    if span <= 3 * max_depth or span > len(held):
        return None
    if not np.array_equal(prompt[diverged:resume], held[len(held) - span :]):
        return None
    return resume
