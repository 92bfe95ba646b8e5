"""The corpus exchange's file protocol (no vLLM needed)."""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from agentspec.engine.exchange import (
    HEADER_BYTES,
    MAX_RECORD_TOKENS,
    CorpusExchange,
    PeerOutput,
    TenantExchange,
    tenant_of,
    tokenizer_digest,
)


def _toks(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def _lists(records: list[PeerOutput]) -> list[list[int]]:
    assert all(r.tokens.dtype == np.int32 for r in records)
    return [r.tokens.tolist() for r in records]


def test_records_carry_the_policy_version_they_were_generated_under(tmp_path: Path) -> None:
    a, b = CorpusExchange(tmp_path, "a"), CorpusExchange(tmp_path, "b")
    assert a.publish(_toks(1, 2), policy_version=7) and a.publish(_toks(3)) and a.publish(_toks(4), 0)
    assert [(r.tokens.tolist(), r.policy_version) for r in b.poll()] == [([1, 2], 7), ([3], None), ([4], 0)]


def test_records_go_both_ways_and_own_records_stay_home(tmp_path: Path) -> None:
    a, b = CorpusExchange(tmp_path, "a"), CorpusExchange(tmp_path, "b")
    assert a.publish(_toks(1, 2, 3))
    assert a.publish(_toks(4))
    assert b.publish(_toks(7, 8))
    assert _lists(b.poll()) == [[1, 2, 3], [4]]
    assert _lists(a.poll()) == [[7, 8]]
    assert a.poll() == [] and b.poll() == []  # each record is delivered once
    a.publish(_toks(5, 6))
    assert _lists(b.poll()) == [[5, 6]]
    assert not a.publish(_toks())  # nothing to share


def test_a_late_reader_gets_what_was_published_before(tmp_path: Path) -> None:
    a = CorpusExchange(tmp_path, "a")
    a.publish(_toks(1, 2))
    assert _lists(CorpusExchange(tmp_path, "late").poll()) == [[1, 2]]


def test_partial_record_waits_until_complete(tmp_path: Path) -> None:
    a, b = CorpusExchange(tmp_path, "a"), CorpusExchange(tmp_path, "b")
    a.publish(_toks(1))
    record = struct.pack("<I", 4) + _toks(-1, 10, 11, 12).astype("<i4").tobytes()  # no version, 3 tokens
    with open(a.path, "ab") as f:  # a writer caught in the middle of its record
        f.write(record[:2])
    assert _lists(b.poll()) == [[1]]
    with open(a.path, "ab") as f:
        f.write(record[2:9])  # header complete, tokens not
    assert b.poll() == []
    with open(a.path, "ab") as f:
        f.write(record[9:])
    assert _lists(b.poll()) == [[10, 11, 12]]
    assert b.poll() == []


def test_started_over_file_is_read_again(tmp_path: Path) -> None:
    # Each record is 4 + 4 * (1 + 4) bytes (length, version, tokens): the third one no
    # longer fits, the file starts over.
    a = CorpusExchange(tmp_path, "a", max_file_bytes=HEADER_BYTES + 2 * 24)
    b = CorpusExchange(tmp_path, "b")
    a.publish(_toks(1, 1, 1, 1))
    a.publish(_toks(2, 2, 2, 2))
    assert len(b.poll()) == 2
    a.publish(_toks(3, 3, 3, 3))
    assert os.path.getsize(a.path) == HEADER_BYTES + 24
    assert _lists(b.poll()) == [[3, 3, 3, 3]]


def test_regrown_file_is_read_again(tmp_path: Path) -> None:
    # Started over and grown past the reader's offset between two polls: the new
    # generation in the header tells, where the size alone would not.
    a = CorpusExchange(tmp_path, "a", max_file_bytes=HEADER_BYTES + 2 * 24)
    b = CorpusExchange(tmp_path, "b")
    a.publish(_toks(1, 1, 1, 1))
    assert len(b.poll()) == 1
    a.publish(_toks(2, 2, 2, 2))
    a.publish(_toks(3, 3, 3, 3))  # starts over
    a.publish(_toks(4, 4, 4, 4))
    assert _lists(b.poll()) == [[3, 3, 3, 3], [4, 4, 4, 4]]


def test_replaced_file_is_read_again(tmp_path: Path) -> None:
    a, b = CorpusExchange(tmp_path, "a"), CorpusExchange(tmp_path, "b")
    a.publish(_toks(1, 2, 3))
    assert len(b.poll()) == 1
    c = CorpusExchange(tmp_path / "elsewhere", "a")
    c.publish(_toks(9))
    os.replace(c.path, a.path)
    assert _lists(b.poll()) == [[9]]


def test_corrupt_length_skips_the_file_until_it_starts_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    a, b = CorpusExchange(tmp_path, "a"), CorpusExchange(tmp_path, "b")
    c = CorpusExchange(tmp_path, "c")
    a.publish(_toks(1))
    with open(a.path, "ab") as f:
        f.write(struct.pack("<I", MAX_RECORD_TOKENS + 1) + b"\0" * 64)
    c.publish(_toks(5))
    with caplog.at_level(logging.WARNING, logger="vllm.agentspec.exchange"):
        assert sorted(_lists(b.poll())) == [[1], [5]]
    assert "corrupt" in caplog.text
    a.publish(_toks(2))  # lands after the garbage: never read
    assert b.poll() == []
    a.close()  # a restarted writer starts its file over
    a.publish(_toks(3))
    assert _lists(b.poll()) == [[3]]


def test_foreign_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "notes.tok").write_bytes(b"hello, this is not an exchange file")
    (tmp_path / "short.tok").write_bytes(b"AG")
    assert CorpusExchange(tmp_path, "b").poll() == []


def test_errors_never_raise(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="vllm.agentspec.exchange"):
        ex = CorpusExchange(blocker / "sub", "a")  # its folder cannot be created
        assert not ex.publish(_toks(1, 2))
        assert ex.poll() == []
    assert "cannot publish" in caplog.text


def test_unwritable_folder(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        assert not CorpusExchange(folder, "a").publish(_toks(1))
    finally:
        folder.chmod(0o755)


def test_a_poll_reads_a_bounded_amount(tmp_path: Path) -> None:
    a = CorpusExchange(tmp_path, "a")
    b = CorpusExchange(tmp_path, "b", max_read_bytes=50)
    for i in range(5):
        a.publish(np.full(4, i, dtype=np.int32))  # 24 bytes each
    assert [r.tokens[0] for r in b.poll()] == [0, 1]
    assert [r.tokens[0] for r in b.poll()] == [2, 3]
    assert [r.tokens[0] for r in b.poll()] == [4]
    a.publish(np.arange(100, dtype=np.int32))  # larger than a poll: read whole all the same
    assert len(b.poll()[0].tokens) == 100


def test_a_reader_far_behind_keeps_the_newest(tmp_path: Path) -> None:
    a = CorpusExchange(tmp_path, "a")
    for i in range(10):
        a.publish(np.full(4, i, dtype=np.int32))  # 24 bytes each
    b = CorpusExchange(tmp_path, "b", max_backlog_bytes=72)
    assert [r.tokens[0] for r in b.poll()] == [7, 8, 9]
    a.publish(_toks(10))
    assert _lists(b.poll()) == [[10]]


def test_names_are_made_safe(tmp_path: Path) -> None:
    ex = CorpusExchange(tmp_path, "host/with space-12-dp0")
    assert ex.path.parent == tmp_path and ex.path.name == "host_with_space-12-dp0.tok"


def test_tenants_have_files_of_their_own(tmp_path: Path) -> None:
    a, b = TenantExchange(tmp_path, "a"), TenantExchange(tmp_path, "b")
    assert a.publish(_toks(1, 2), "k-1") and a.publish(_toks(3), "") and a.publish(_toks(4), "k-2.s-9")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tok", "a~k-1.tok", "a~k-2.s-9.tok"]
    assert sorted((t, x.tokens.tolist()) for t, x in b.poll()) == [("", [3]), ("k-1", [1, 2]), ("k-2.s-9", [4])]
    assert b.poll() == [] and a.poll() == []  # nothing new, and never one's own records
    assert tenant_of("a~k-1.tok") == "k-1" and tenant_of("a.tok") == ""
    with pytest.raises(ValueError, match="tenant ids"):
        CorpusExchange(tmp_path, "c", tenant="../x")


def test_files_of_another_model_or_tokenizer_are_skipped_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Same served name and vocabulary size, another tokenizer digest: the ids mean other text.
    ours, theirs = "m:512:aaaaaaaaaaaaaaaa", "m:512:bbbbbbbbbbbbbbbb"
    a, other = CorpusExchange(tmp_path, "a", model=ours), CorpusExchange(tmp_path, "o", model=theirs)
    b = CorpusExchange(tmp_path, "b", model=ours)
    a.publish(_toks(1, 2))
    other.publish(_toks(6, 6))
    with caplog.at_level(logging.WARNING, logger="vllm.agentspec.exchange"):
        assert _lists(b.poll()) == [[1, 2]]
    assert "another model or tokenizer" in caplog.text
    other.publish(_toks(7, 7))
    assert b.poll() == []
    assert b.counters() == {"exchange_skipped_foreign_total": 1}  # once per file, not per poll
    assert _lists(other.poll()) == []  # the other way round too


def test_files_of_another_format_version_are_foreign(tmp_path: Path) -> None:
    a = CorpusExchange(tmp_path, "a")
    a.publish(_toks(1, 2, 3, 4, 5, 6, 7, 8))
    with open(a.path, "r+b") as f:  # an agentspec writing format 2 (no model in its header)
        f.seek(4)
        f.write(struct.pack("<I", 2))
    b = CorpusExchange(tmp_path, "b")
    assert b.poll() == []
    assert b.counters() == {"exchange_skipped_foreign_total": 1}


def test_corrupt_files_are_counted_once_each(tmp_path: Path) -> None:
    (tmp_path / "notes.tok").write_bytes(b"hello, this is not an exchange file, is it now?")
    a = CorpusExchange(tmp_path, "a")
    a.publish(_toks(1))
    with open(a.path, "ab") as f:
        f.write(struct.pack("<I", MAX_RECORD_TOKENS + 1) + b"\0" * 64)
    ex = TenantExchange(tmp_path, "b")
    assert [x.tokens.tolist() for _, x in ex.poll()] == [[1]]
    assert ex.poll() == []
    assert ex.counters() == {"exchange_skipped_corrupt_total": 2}


class _Tokenizer:
    """What the digest reads of a tokenizer."""

    def __init__(self, vocab: dict[str, int], special: list[int]) -> None:
        self.vocab, self.all_special_ids = vocab, special

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)


def test_the_tokenizer_digest_tells_vocabularies_apart() -> None:
    vocab = {"a": 0, "b": 1, "ab": 2, "<eos>": 3}
    ours = tokenizer_digest(_Tokenizer(vocab, [3]))
    assert len(ours) == 16
    assert tokenizer_digest(_Tokenizer(dict(reversed(vocab.items())), [3])) == ours  # the order it loads in
    assert tokenizer_digest(_Tokenizer({**vocab, "a": 1, "b": 0}, [3])) != ours  # ids that mean other text
    assert tokenizer_digest(_Tokenizer({**vocab, "<tool>": 4}, [3])) != ours  # an added token
    assert tokenizer_digest(_Tokenizer(vocab, [])) != ours  # other special ids
    assert tokenizer_digest(_Tokenizer({"a": 0, "b\t1\ta": 1}, [])) != tokenizer_digest(
        _Tokenizer({"a\t1\tb": 0, "a": 1}, [])
    )
