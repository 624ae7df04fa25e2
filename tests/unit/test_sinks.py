"""File sinks on real files: atomic parts, adopt/discard, both formats, bad values, audit checks."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rayorch.core.facts import OutputEmitted, pack_value
from rayorch.core.outcome import FailedResult, Outcome
from rayorch.runtime.formats import part_format
from rayorch.runtime.sink_audit import check_delivery
from rayorch.runtime.sinks import (
    SINK_MANIFEST,
    FileSink,
    SinkError,
    delivered_count,
    read_outputs,
    sink_for_run,
)
from rayorch.store.records import ManifestError, RunManifest

REPO = Path(__file__).resolve().parents[2]
FORMATS = ["jsonl", "parquet", "jsonl.zst", "wds"]

VALUES: list[tuple[int, Any]] = [
    (4, {"text": "héllo", "pages": (1, 2), "raw": b"\x00\xff", "n": None}),
    (1, FailedResult(1, Outcome.FAILED, "ValueError: bad page", "doc")),
    (7, (np.arange(3, dtype=np.int32), np.float64(0.25), True)),
    (2, FailedResult(2, Outcome.SUPPRESSED, None, "doc")),
    (9, [[1.5, -2], {"k": []}]),
]
EXPECTED = {
    4: {"index": 4, "outcome": "present",
        "value": {"text": "héllo", "pages": [1, 2], "raw": {"$bytes": "AP8="}, "n": None}},
    1: {"index": 1, "outcome": "failed", "cause": "ValueError: bad page", "output": "doc"},
    7: {"index": 7, "outcome": "present", "value": [[0, 1, 2], 0.25, True]},
    2: {"index": 2, "outcome": "suppressed", "cause": None, "output": "doc"},
    9: {"index": 9, "outcome": "present", "value": [[1.5, -2], {"k": []}]},
}


def visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_facts_and_digests(tmp_path: Path, fmt: str) -> None:
    sink = FileSink(tmp_path / "out", fmt, run_id="r1")
    assert sink.format == fmt
    facts = sink.write_part(3, VALUES)
    assert [f.index for f in facts] == [i for i, _ in VALUES]
    assert [f.outcome for f in facts] == ["present", "failed", "present", "suppressed",
                                          "present"]
    (name,) = {f.sink for f in facts}
    assert name.startswith(f"{fmt}:part-s00003-000000000001-5-") and name.endswith(
        "." + part_format(fmt).suffix)
    assert visible(tmp_path / "out") == sorted([SINK_MANIFEST, name.partition(":")[2]])
    records = list(read_outputs(tmp_path / "out"))
    assert {r["index"]: r for r in records} == EXPECTED
    assert len(records) == 5 == delivered_count(tmp_path / "out")
    assert check_delivery(tmp_path / "out", facts, complete=True) == []
    if fmt == "jsonl":  # the digest is the SHA-256 of the record's line, as users can check
        lines = (tmp_path / "out" / name.partition(":")[2]).read_bytes().splitlines()
        assert [hashlib.sha256(line).hexdigest() for line in lines] == [f.digest for f in facts]
    # The same records give the same digests in either format (one canonical form).
    other = FileSink(tmp_path / "other", "parquet" if fmt == "jsonl" else "jsonl", run_id="r1")
    assert [f.digest for f in other.write_part(0, VALUES)] == [f.digest for f in facts]


def test_parquet_columns_read_with_pyarrow(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    FileSink(tmp_path, "parquet", run_id="r").write_part(0, VALUES[:2])
    (part,) = tmp_path.glob("part-*.parquet")
    table = pq.read_table(part)
    assert [(f.name, str(f.type)) for f in table.schema] == [
        ("index", "int64"), ("outcome", "string"), ("value_json", "string"),
        ("cause", "string"), ("output", "string")]
    assert table.column("cause").to_pylist() == [None, "ValueError: bad page"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_crash_before_the_part_is_published_leaves_no_visible_part(
        tmp_path: Path, fmt: str) -> None:
    """The writer dies at its first fsync (as in a power cut before the data is durable)."""
    script = (
        "import os, signal, sys\n"
        "from rayorch.runtime.sinks import FileSink\n"
        "sink = FileSink(sys.argv[1], sys.argv[2], run_id='r')\n"
        "os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        "sink.write_part(0, [(i, {'v': 'x' * 1000}) for i in range(50)])\n"
    )
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", script, str(out), fmt], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert visible(out) == [SINK_MANIFEST]
    assert list(read_outputs(out)) == []
    sink = FileSink(out, fmt, run_id="r")  # the leftover temp file does not block the dir
    facts = sink.write_part(0, [(0, 1)])
    assert [r["index"] for r in read_outputs(out)] == [0]
    assert check_delivery(out, facts, complete=True) == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_adopt_claims_a_dead_holders_part_without_writing_twice(tmp_path: Path, fmt: str) -> None:
    dead = FileSink(tmp_path, fmt, run_id="r")
    written = dead.write_part(1, [(1, "a"), (5, "b"), (9, "c")])  # its facts never landed
    dead.write_part(2, [(2, "other shard")])
    heir = FileSink(tmp_path, fmt, run_id="r")
    adopted = heir.adopt(1, [9, 1, 5, 13])
    assert sorted(f.index for f in adopted) == [1, 5, 9]  # 13 was never written
    assert {f.index: f.digest for f in adopted} == {f.index: f.digest for f in written}
    assert {f.sink for f in adopted} == {f.sink for f in written}  # claimed, not copied
    assert sorted(r["index"] for r in read_outputs(tmp_path)) == [1, 2, 5, 9]
    assert check_delivery(tmp_path, adopted, complete=False) == []
    # The deposed writer's refused append now discards: the adopted part stays.
    dead.discard(written)
    assert check_delivery(tmp_path, adopted, complete=False) == []
    assert heir.adopt(2, []) == [] and heir.adopt(3, [2]) == []


def test_adopt_keeps_only_the_wanted_records(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, run_id="r")
    sink.write_part(0, [(0, "a"), (1, "b"), (2, "c")])
    adopted = sink.adopt(0, [1, 2])
    assert sorted(r["index"] for r in read_outputs(tmp_path)) == [1, 2]
    assert check_delivery(tmp_path, adopted, complete=True) == []


def test_discard_removes_the_part_and_a_discarded_part_is_not_adopted(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, run_id="r")
    kept = sink.write_part(0, [(0, "a")])
    refused = sink.write_part(0, [(1, "b"), (2, "c")])
    sink.discard(refused)
    assert [r["index"] for r in read_outputs(tmp_path)] == [0]
    assert sink.adopt(0, [1, 2]) == []
    sink.discard(refused)  # twice is harmless
    assert check_delivery(tmp_path, kept, complete=True) == []


@pytest.mark.parametrize(("value", "words"), [
    ({1, 2}, "set"),
    ({1: "a"}, "Dict key must be str"),
    (2**70, "64-bit"),
    (float("nan"), "NaN"),
    ({"x": [np.array([1.0, np.inf])]}, "NaN"),
    (object(), "object"),
])
def test_a_value_json_cannot_hold_is_refused_naming_the_source(
        tmp_path: Path, value: Any, words: str) -> None:
    sink = FileSink(tmp_path, run_id="r")
    with pytest.raises(SinkError, match=f"^source 42: its output \\(type {type(value).__name__}"
                       rf"\).*{words}") as err:
        sink.write_part(0, [(41, "fine"), (42, value)])
    assert "\n" not in str(err.value)
    assert visible(tmp_path) == [SINK_MANIFEST]


def test_foreign_directories_are_refused(tmp_path: Path) -> None:
    FileSink(tmp_path / "a", "jsonl", run_id="r1").write_part(0, [(0, 1)])
    with pytest.raises(SinkError, match="outputs of run 'r1', not 'r2'"):
        FileSink(tmp_path / "a", "jsonl", run_id="r2")
    with pytest.raises(SinkError, match="jsonl sink of run r1; pass --format jsonl"):
        FileSink(tmp_path / "a", "parquet", run_id="r1")
    old = tmp_path / "old"  # the former one-file-per-source sink
    old.mkdir()
    (old / "3.msgpack").write_bytes(pack_value({"index": 3}))
    with pytest.raises(SinkError, match=r"not rayorch part files \(3\.msgpack\)"):
        FileSink(old, run_id="r1")
    (tmp_path / "a" / "notes.txt").write_text("mine")
    with pytest.raises(SinkError, match=r"notes\.txt"):
        FileSink(tmp_path / "a", "jsonl", run_id="r1")
    with pytest.raises(SinkError, match=r"notes\.txt"):
        list(read_outputs(tmp_path / "a"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / SINK_MANIFEST).write_text('{"run": "r1"}')
    with pytest.raises(SinkError, match="not a rayorch sink manifest"):
        FileSink(bad, run_id="r1")
    with pytest.raises(SinkError, match="unknown output format 'csv'"):
        FileSink(tmp_path / "c", "csv", run_id="r1")
    with pytest.raises(SinkError, match="not a rayorch output directory"):
        list(read_outputs(tmp_path))


def test_read_outputs_refuses_a_source_twice_and_audit_names_the_leftover(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, run_id="r")
    delivered = sink.write_part(0, [(0, "a"), (1, "b")])
    leftover = sink.write_part(0, [(1, "b")])  # a deposed driver died before discarding
    with pytest.raises(SinkError, match="source 1 is in two part files"):
        list(read_outputs(tmp_path))
    leftover_name = leftover[0].sink.partition(":")[2]
    assert check_delivery(tmp_path, delivered, complete=False) == []
    assert check_delivery(tmp_path, delivered, complete=True) == [
        f"part {leftover_name} in {tmp_path} is named by no OutputEmitted fact (left by a "
        "driver that died while deposed): delete it"]


def test_check_delivery_finds_missing_altered_and_absent_records(tmp_path: Path) -> None:
    sink = FileSink(tmp_path, run_id="r")
    first = sink.write_part(0, [(0, {"v": 1}), (1, {"v": 2})])
    second = sink.write_part(1, [(2, "x")])
    facts = [*first, *second, OutputEmitted(3, "present", "caller"), OutputEmitted(4)]
    assert check_delivery(tmp_path, facts, complete=True) == []
    part1 = tmp_path / first[0].sink.partition(":")[2]
    part2 = tmp_path / second[0].sink.partition(":")[2]
    lines = part1.read_bytes().splitlines()
    part1.write_bytes(lines[0].replace(b'"v":1', b'"v":7') + b"\n")  # altered, one dropped
    part2.unlink()
    problems = check_delivery(tmp_path, facts, complete=True)
    assert problems[0].startswith(f"source 0: its record in part {part1.name} was altered")
    assert problems[1:] == [
        f"source 1: part {part1.name} holds no record of it",
        f"part {part2.name} is missing from {tmp_path}: sources 2 were delivered to it"]
    sneaky = [OutputEmitted(5, "present", "jsonl:../../etc/passwd", "00")]
    assert check_delivery(tmp_path, sneaky, complete=False) == [
        f"sources 5: delivered to 'jsonl:../../etc/passwd', which is not a jsonl part of "
        f"{tmp_path}"]
    assert "pass --out-dir" in check_delivery(None, first, complete=False)[0]
    assert check_delivery(None, [OutputEmitted(0, sink="caller")], complete=True) == []


def test_sink_for_run_keeps_one_run_in_one_place(tmp_path: Path) -> None:
    assert sink_for_run("r", None, "jsonl", None, None) is None
    chosen = sink_for_run("r", None, "jsonl", tmp_path / "a", "parquet")
    assert chosen is not None and chosen.format == "parquet"
    own = sink_for_run("r", str(tmp_path / "b"), "parquet", None, None)
    assert own is not None and own.format == "parquet"
    with pytest.raises(SinkError, match=r"writes its outputs to .*; drop --out-dir"):
        sink_for_run("r", str(tmp_path / "b"), "parquet", tmp_path / "c", None)
    with pytest.raises(SinkError, match=r"writes parquet outputs .*; drop --format"):
        sink_for_run("r", str(tmp_path / "b"), "parquet", None, "jsonl")
    with pytest.raises(SinkError, match="--format needs --out-dir"):
        sink_for_run("r", None, "jsonl", None, "parquet")


def test_manifest_records_the_format_and_old_manifests_still_decode() -> None:
    manifest = RunManifest("m:P", (1,), {"k": 2}, (("a",),), "/out", 8, None, "parquet")
    assert RunManifest.decode(manifest.encode()) == manifest
    old = pack_value([1, "m:P", [1], {"k": 2}, [["a"]], "/out", 8, None])
    assert RunManifest.decode(old) == RunManifest("m:P", (1,), {"k": 2}, (("a",),), "/out", 8,
                                                  None, "jsonl")
    with pytest.raises(ManifestError, match="damaged"):
        RunManifest.decode(pack_value([2, "m:P"]))
    with pytest.raises(ManifestError, match="version 9"):
        RunManifest.decode(pack_value([9]))
