"""Archive segments (``rayorch/store/archive.py``) are untrusted bytes when read back: a
corrupt, foreign or out-of-range segment is an ``ArchiveError`` naming it, never a crash or
a fact of another run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayorch.core.facts import SourceAdmitted
from rayorch.store.archive import (
    ArchiveError,
    FactArchive,
    decode_segment,
    encode_segment,
    segment_key,
)
from rayorch.store.records.facts import encode_fact

FACTS = [(1, "root", encode_fact(SourceAdmitted(0, ("a",)))),
         (2, "root", encode_fact(SourceAdmitted(1, ("b",))))]


def test_a_segment_reads_back_and_names_its_range() -> None:
    blob = encode_segment("run", 0, FACTS)
    assert decode_segment(blob, "k", "run", 0) == FACTS
    assert segment_key("run", 3, 1, 20) == "run/3/000000000001-000000000020.facts"


@pytest.mark.parametrize("blob, says", [
    (b"RA1z" + b"\x00garbage", "corrupt"),
    (b"RA1l" + b"\x00garbage", "corrupt"),
    (b"PK\x03\x04zip", "not a rayorch archive segment"),
    (b"", "not a rayorch archive segment"),
])
def test_bytes_that_are_not_a_segment_are_refused(blob: bytes, says: str) -> None:
    with pytest.raises(ArchiveError, match=says):
        decode_segment(blob, "run/0/x.facts", "run", 0)


def test_a_segment_of_another_run_or_shard_is_refused() -> None:
    blob = encode_segment("other", 0, FACTS)
    with pytest.raises(ArchiveError, match="another run or shard"):
        decode_segment(blob, "run/0/x.facts", "run", 0)
    with pytest.raises(ArchiveError, match="another run or shard"):
        decode_segment(encode_segment("run", 1, FACTS), "run/0/x.facts", "run", 0)


def test_overlapping_segments_read_each_seq_once_and_a_segment_is_never_replaced(
        tmp_path: Path) -> None:
    archive = FactArchive(str(tmp_path))
    archive.write("run", 0, FACTS[:1])
    archive.write("run", 0, FACTS)  # a second archiver of an overlapping range
    before = (tmp_path / segment_key("run", 0, 1, 1)).read_bytes()
    archive.write("run", 0, [(1, "root", encode_fact(SourceAdmitted(9, ("z",))))])
    assert (tmp_path / segment_key("run", 0, 1, 1)).read_bytes() == before  # kept
    fresh = FactArchive(str(tmp_path))
    assert list(fresh.facts("run", 0, 0, 2)) == FACTS
    assert list(fresh.facts("run", 0, 1, 2)) == FACTS[1:]
    assert fresh.watermark("run", 0) == 2
    assert list(fresh.facts("run", 0, 0, 2, frozenset({"root/0"}))) == []
