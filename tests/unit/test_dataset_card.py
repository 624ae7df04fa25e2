"""The shards' dataset card and WebDataset layout 2, read by Hugging Face ``datasets`` and the
``webdataset`` library: documents with and without figures in one tar, a failed source
after five clean ones, a video's clips one sample each (rayorch/runtime/formats/card.py,
rayorch/runtime/formats/wds.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayorch.core.outcome import FailedResult, Outcome
from rayorch.runtime.formats.card import card_text, write_card
from rayorch.runtime.formats.rows import from_json
from rayorch.runtime.sinks import FileSink, read_outputs
from rayorch.storage import open_storage

datasets = pytest.importorskip("datasets")
pytest.importorskip("pyarrow")


def pdf_document(i: int, figures: int) -> dict[str, Any]:
    return {"path": f"/in/{i}.pdf", "title": f"Doc {i}", "pages": 1,
            "markdown": f"<!-- page 1 engine=text -->\nBody {i}", "page_engines": ["text"],
            "empty_pages": [], "garbage_pages": [], "content_list": [],
            "figures": {f"figures/{i}-{k}.png": b"\x89PNG" + bytes([k]) for k in range(figures)}}


def write(out: Path, fmt: str, values: list[Any], schema: Any) -> list[Any]:
    """The sink's part, what rayorch reads back of it, then the card beside it (as a job
    writes it when its run ends: a plain sink allows no file it does not know)."""
    sink = FileSink(out, fmt, run_id="r1", schema=schema)
    sink.write_part(0, list(enumerate(values)))
    back = list(read_outputs(out))
    write_card(open_storage(out), schema, fmt)
    return back


@pytest.mark.parametrize("fmt", ["wds", "parquet", "jsonl.zst"])
def test_mixed_documents_load_with_the_cards_types(tmp_path: Path, fmt: str) -> None:
    from rayorch.pipelines.job.shard_rows import pdf_row, pdf_rows

    values: list[Any] = [pdf_row(i, pdf_document(i, figures=0 if i < 5 else i % 3), f"/{i}",
                                 "r1", "c") for i in range(8)]
    values.append(FailedResult(8, Outcome.FAILED, "damaged: no %%EOF", "doc"))
    back = write(tmp_path / "out", fmt, values, pdf_rows())
    hf = datasets.load_dataset(str(tmp_path / "out"), split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == 9
    rows = sorted(hf, key=lambda r: (r["json"] if fmt == "wds" else r)["id"])
    if fmt == "wds":
        assert [len(r["figures.mp"] or []) for r in rows] == [0, 0, 0, 0, 0, 2, 0, 1, 0]
        assert rows[5]["figures.mp"][1] == b"\x89PNG\x01"
        assert rows[8]["json"]["cause"] == "damaged: no %%EOF" and rows[8]["md"] is None
        assert rows[0]["md"] == b"<!-- page 1 engine=text -->\nBody 0"
    else:
        assert [len(r["figures"] or []) for r in rows] == [0, 0, 0, 0, 0, 2, 0, 1, 0]
        assert rows[8]["cause"] == "damaged: no %%EOF"
    # rayorch reads back what it wrote, whichever format
    assert [r["index"] for r in back] == list(range(9))


def test_a_videos_clips_are_one_sample_each(tmp_path: Path) -> None:
    import webdataset

    from rayorch.pipelines.job.shard_rows import video_row, video_rows

    clip = tmp_path / "c.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    values = []
    for i, clips in enumerate([2, 0, 1, 0, 0, 0, 3]):
        value = {"path": f"/in/{i}.mp4", "duration_s": 4, "fps": 25, "width": 64,
                 "height": 48, "cuts": [], "clips": [
                     {"clip": k, "start_s": k, "end_s": k + 1, "frames": 25,
                      **({"file": str(clip)} if k % 2 == 0 else {})} for k in range(clips)]}
        values.append(video_row(i, value, f"/in/{i}.mp4", "r1", "c"))
    back = write(tmp_path / "out", "wds", values, video_rows())
    tars = sorted(str(p) for p in (tmp_path / "out").glob("part-*.tar"))
    samples = list(webdataset.WebDataset(tars, shardshuffle=False))
    assert [s["__key__"] for s in samples][:3] == ["000000000_00000", "000000000_00001",
                                                   "000000001"]
    assert len(samples) == 2 + 1 + 1 + 1 + 1 + 1 + 3  # a clip each; a video without, one
    assert samples[0]["mp4"] == clip.read_bytes() and "mp4" not in samples[1]
    hf = datasets.load_dataset(str(tmp_path / "out"), split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == len(samples)
    assert [r["json"]["$entry"]["index"] if r["json"]["$entry"] else None
            for r in hf][:3] == [0, 1, None]
    assert [len(r["value"]["clips"]) for r in back] == [2, 0, 1, 0, 0, 0, 3]
    assert from_json(back[0]["value"]["clips"][0]["data"]) == clip.read_bytes()


def test_the_card_declares_the_shard_files_only() -> None:
    from rayorch.pipelines.job.shard_rows import pdf_rows

    text = card_text(pdf_rows(), "parquet")
    assert '"part-*.parquet"' in text and "_index" not in text.split("---")[1]
