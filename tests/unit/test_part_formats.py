"""Part formats and size-rolled parts, on real files: every format gives back the records
it was given (the same digests), rows of the PDF schema keep their types, parts roll under
1.1x the target, and a shard's name is its content's."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from rayorch.core.outcome import FailedResult, Outcome
from rayorch.pipelines.job.shard_rows import pdf_row, pdf_rows
from rayorch.runtime.formats import format_names, part_format
from rayorch.runtime.formats.wds import sample_members
from rayorch.runtime.sinks import FileSink, read_outputs, read_part
from rayorch.storage import open_storage
from rayorch.store.records.sink import PartName, encode_record

pytest.importorskip("pyarrow")
pytest.importorskip("zstandard")


def document(i: int, *, text: str = "Body text. ", figures: int = 1) -> dict[str, Any]:
    return {"path": f"/in/{i}.pdf", "title": f"Doc {i}", "pages": 2,
            "markdown": f"<!-- page 1 engine=text -->\n{text * 3}\n<!-- page 2 engine=ocr -->\nB",
            "page_engines": ["text", "ocr"], "empty_pages": [], "garbage_pages": [2],
            "content_list": [{"type": "text", "text": "Body", "bbox": [0, 1, 50, 9],
                              "page_idx": 0},
                             {"type": "table", "table_body": "<table/>", "bbox": [1, 2, 3, 4],
                              "page_idx": 1}],
            "figures": {f"figures/x{k or ''}.png": b"\x89PNG\x00" + bytes([255 - k])
                        for k in range(figures)},
            "metadata": {"lang": "en", "year": 2020}}


def noise(seed: int, words: int) -> str:
    """Text that does not compress away (hex digests), so parts fill at every format."""
    return " ".join(hashlib.sha256(f"{seed}-{k}".encode()).hexdigest() for k in range(words))


def records(n: int, **kw: Any) -> list[Any]:
    out = [encode_record(i, pdf_row(i, document(i, **kw), f"/in/{i}.pdf", "run-1", "cfg"))
           for i in range(n)]
    out.append(encode_record(n, FailedResult(n, Outcome.FAILED, "bad pdf", "doc")))
    return out


@pytest.mark.parametrize("fmt", format_names())
def test_every_format_gives_back_the_records_and_their_digests(fmt: str) -> None:
    given = records(3)
    got = part_format(fmt).decode(part_format(fmt).encode(given, pdf_rows()), "part")
    assert [(r.index, r.outcome, r.digest) for r in got] == \
        [(r.index, r.outcome, r.digest) for r in given]
    generic = part_format(fmt).decode(part_format(fmt).encode(given, None), "part")
    assert [r.digest for r in generic] == [r.digest for r in given]


def test_a_pdf_row_is_typed_by_its_schema() -> None:
    row = pdf_row(0, document(0), "/in/0.pdf", "run-1", "cfg")
    assert row["pages"] == [
        {"number": 1, "engine": "text", "chars": len(("Body text. " * 3).strip()),
         "warnings": []},
        {"number": 2, "engine": "ocr", "chars": 1, "warnings": ["garbage text layer"]}]
    assert row["blocks"][0]["bbox"] == [0.0, 1.0, 50.0, 9.0] and row["blocks"][0]["page"] == 1
    assert row["blocks"][1]["html"] == "<table/>"
    assert row["figures"] == [{"name": "figures/x.png", "data": b"\x89PNG\x00\xff"}]
    assert row["metadata"] == '{"lang":"en","year":2020}'
    assert list(row)[:5] == ["id", "source", "status", "cause", "metadata"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl.zst", "wds"])
def test_parts_roll_by_size_and_hold_each_source_once(tmp_path: Path, fmt: str) -> None:
    target = 30_000
    sink = FileSink(tmp_path / "out", fmt, run_id="r1", schema=pdf_rows(), shard_size=target)
    facts = []
    for start in range(0, 60, 4):  # deliveries of four documents, as a driver makes them
        batch = [(i, pdf_row(i, document(i, text=noise(i, 20 + 10 * (i % 7))), f"/{i}", "r1",
                             "c")) for i in range(start, start + 4)]
        facts += sink.write_part(0, batch)
    assert 0 < len(facts) < 60 and sink.spooled(0) == 60 - len(facts)
    facts += sink.seal(0)
    assert sorted(f.index for f in facts) == list(range(60)) and sink.spooled(0) == 0
    storage = open_storage(tmp_path / "out")
    names = sorted({f.sink.partition(":")[2] for f in facts})
    assert len(names) > 2
    last = max(names, key=lambda n: PartName.parse(n).first)  # type: ignore[union-attr]
    for name in names:
        size = len(storage.read(name))
        one = PartName.parse(name).count == 1  # type: ignore[union-attr]
        assert size <= 1.1 * target or name == last or one, (name, size)
        assert {r.index: d for r, d in read_part(storage, name)} == \
            {f.index: f.digest for f in facts if f.sink.endswith(name)}
    assert sorted(r["index"] for r in read_outputs(tmp_path / "out")) == list(range(60))


def test_a_shard_is_named_by_its_content_and_published_once(tmp_path: Path) -> None:
    """A retried publish of the same records finds its own part: no second copy."""
    first = FileSink(tmp_path / "out", "parquet", run_id="r1", schema=pdf_rows(),
                     shard_size=10**9)
    rows = [(i, pdf_row(i, document(i), f"/{i}", "r1", "c")) for i in range(3)]
    assert first.write_part(0, rows) == []  # spooled: not delivered yet
    sealed = first.seal(0)
    again = FileSink(tmp_path / "out", "parquet", run_id="r1", schema=pdf_rows())
    again.spool = type(first.spool)(10**9)  # type: ignore[misc]
    again.write_part(0, rows)
    resealed = again.seal(0)
    assert [f.sink for f in resealed] == [f.sink for f in sealed]
    assert len(list((tmp_path / "out").glob("part-*"))) == 1


def test_a_rebuilt_shard_forgets_its_spool(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "out", "wds", run_id="r1", schema=pdf_rows(), shard_size=10**9)
    sink.write_part(0, [(0, pdf_row(0, document(0), "/0", "r1", "c"))])
    sink.reset(0)
    assert sink.spooled(0) == 0 and sink.seal(0) == []
    assert not list((tmp_path / "out").glob("part-*"))


def test_a_video_row_holds_its_clips_and_their_mp4(tmp_path: Path) -> None:
    from rayorch.pipelines.job.shard_rows import video_row, video_rows

    clip_file = tmp_path / "0000.mp4"
    clip_file.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    value = {"path": "/in/v.mp4", "duration_s": 4, "fps": 25, "width": 64, "height": 48,
             "cuts": [2], "clips": [
                 {"video": "/in/v.mp4", "clip": 0, "start_s": 0, "end_s": 2.0, "frames": 50,
                  "annotation": {"caption": "a cat", "model": "m"}, "file": str(clip_file)},
                 {"video": "/in/v.mp4", "clip": 1, "start_s": 2.0, "end_s": 4, "frames": 50}]}
    row = video_row(3, value, "/in/v.mp4", "r1", "c")
    assert row["cuts"] == [2.0] and row["duration_s"] == 4.0
    assert row["clips"][0]["data"] == clip_file.read_bytes()
    assert row["clips"][0]["annotation"] == '{"caption":"a cat","model":"m"}'
    assert row["clips"][1]["data"] is None and row["clips"][1]["file"] is None
    given = [encode_record(3, row)]
    for fmt in ("parquet", "jsonl.zst", "wds"):
        data = part_format(fmt).encode(given, video_rows())
        assert [r.digest for r in part_format(fmt).decode(data, "p")] == [given[0].digest]
    # WebDataset: one sample per clip (its json and, when written, its mp4)
    names = [n for n, _ in sample_members(given[0], video_rows())]
    assert names == ["000000003_00000.json", "000000003_00000.mp4", "000000003_00001.json"]
    two = [encode_record(3, row), encode_record(4, {**row, "id": 4, "clips": []})]
    tar = part_format("wds").encode(two, video_rows())
    assert [r.digest for r in part_format("wds").decode(tar, "p")] == [r.digest for r in two]


def test_every_pdf_sample_has_the_same_members_however_many_figures() -> None:
    """Hugging Face's webdataset loader needs one member set per tar: figures travel in one
    msgpack member, text in one md member, whatever the document holds."""
    rows = [pdf_row(i, document(i, figures=i % 3), f"/{i}", "r1", "c") for i in range(4)]
    records = [encode_record(i, r) for i, r in enumerate(rows)]
    sets = {tuple(n.partition(".")[2] for n, _ in sample_members(r, pdf_rows()))
            for r in records}
    assert sets == {("json", "md", "figures.mp")}
    tar = part_format("wds").encode(records, pdf_rows())
    assert [r.digest for r in part_format("wds").decode(tar, "p")] == [r.digest for r in records]
