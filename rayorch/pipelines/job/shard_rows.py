"""The typed rows of the jobs' shard formats (``--format parquet|jsonl.zst|wds``).

With a shard format a job writes no file per source: each finished source is one row of a
declared, versioned schema (docs/output-formats.md), which the sink's format stores in
parts rolled by size (:mod:`rayorch.runtime.formats`). A row is built from the pipeline's
result here and normalized to its schema, so every format reads back the same row.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import orjson

from rayorch.runtime.formats import RowSchema

PAGE_MARKER = re.compile(r"<!-- page (\d+) engine=[^>]*-->\n?")


@functools.cache
def _schemas() -> tuple[RowSchema, RowSchema]:
    import pyarrow as pa

    common = [pa.field("id", pa.int64()), pa.field("source", pa.string()),
              pa.field("status", pa.string()), pa.field("cause", pa.string()),
              pa.field("metadata", pa.string())]
    provenance = [pa.field("run_id", pa.string()), pa.field("config", pa.string())]
    page = pa.struct([("number", pa.int32()), ("engine", pa.string()), ("chars", pa.int64()),
                      ("warnings", pa.list_(pa.string()))])
    block = pa.struct([("type", pa.string()), ("bbox", pa.list_(pa.float64())),
                       ("page", pa.int32()), ("text", pa.string()), ("html", pa.string()),
                       ("latex", pa.string()), ("image", pa.string())])
    figure = pa.struct([("name", pa.string()), ("data", pa.binary())])
    pdf = RowSchema("rayorch.pdf", 1, (
        *common, pa.field("title", pa.string()), pa.field("markdown", pa.string()),
        pa.field("pages", pa.list_(page)), pa.field("blocks", pa.list_(block)),
        pa.field("figures", pa.list_(figure)), *provenance),
        text="markdown", binary=("figures", "png"))
    clip = pa.struct([("clip", pa.int32()), ("start_s", pa.float64()),
                      ("end_s", pa.float64()), ("frames", pa.int64()),
                      ("annotation", pa.string()), ("file", pa.string()),
                      ("data", pa.binary())])
    video = RowSchema("rayorch.video", 1, (
        *common, pa.field("duration_s", pa.float64()), pa.field("fps", pa.float64()),
        pa.field("width", pa.int64()), pa.field("height", pa.int64()),
        pa.field("cuts", pa.list_(pa.float64())), pa.field("clips", pa.list_(clip)),
        *provenance), binary=("clips", "mp4"), explode="clips")
    return pdf, video


def pdf_rows() -> RowSchema:
    """The PDF job's row schema (``rayorch.pdf``, version 1; needs pyarrow)."""
    return _schemas()[0]


def video_rows() -> RowSchema:
    """The video job's row schema (``rayorch.video``, version 1; needs pyarrow)."""
    return _schemas()[1]


def job_rows(job: str) -> RowSchema | None:
    return {"pdf": pdf_rows, "video": video_rows}[job]() if job in ("pdf", "video") else None


def _metadata(value: dict[str, Any]) -> str:
    meta = value.get("metadata")
    return orjson.dumps(meta if isinstance(meta, dict) else {}).decode()


def page_chars(markdown: str) -> dict[int, int]:
    """Characters of each page's text in a Markdown with page markers (``{}`` without)."""
    parts = PAGE_MARKER.split(markdown)
    return {int(parts[i]): len(parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2)}


def _pages(value: dict[str, Any]) -> list[dict[str, Any]]:
    engines = list(value.get("page_engines") or [])
    chars = page_chars(value["markdown"])
    flags = {"empty": value.get("empty_pages", ()),
             "no text layer": value.get("no_layer_pages", ()),
             "garbage text layer": value.get("garbage_pages", ())}
    return [{"number": n, "engine": engines[n - 1] if n <= len(engines) else None,
             "chars": chars.get(n), "warnings": [w for w, pages in flags.items() if n in pages]}
            for n in range(1, int(value["pages"]) + 1)]


def _block(entry: dict[str, Any]) -> dict[str, Any]:
    page = entry.get("page_idx")
    return {"type": entry.get("type"), "bbox": entry.get("bbox"),
            "page": page + 1 if isinstance(page, int) else None,
            "text": entry.get("text"), "html": entry.get("table_body"),
            "latex": entry.get("latex"), "image": entry.get("img_path")}


def pdf_row(index: int, value: dict[str, Any], source: str | None, run_id: str,
            config: str) -> dict[str, Any]:
    """A finished document's row (``value``: the pipeline's ``AssembleDocument`` dict)."""
    return pdf_rows().normalize({
        "id": index, "source": source, "status": "ok", "cause": None,
        "metadata": _metadata(value), "title": value.get("title"),
        "markdown": value["markdown"], "pages": _pages(value),
        "blocks": [_block(e) for e in value.get("content_list", ()) if isinstance(e, dict)],
        "figures": [{"name": name, "data": png}
                    for name, png in sorted((value.get("figures") or {}).items())],
        "run_id": run_id, "config": config})


def video_row(index: int, value: dict[str, Any], source: str | None, run_id: str,
              config: str) -> dict[str, Any]:
    """A finished video's row; a clip file ``--write-clips`` made is held as its bytes."""
    clips = []
    for clip in value["clips"]:
        file = clip.get("file")
        data = Path(file).read_bytes() if isinstance(file, str) and Path(file).is_file() \
            else None
        annotation = clip.get("annotation")
        clips.append({"clip": clip.get("clip"), "start_s": clip.get("start_s"),
                      "end_s": clip.get("end_s"), "frames": clip.get("frames"),
                      "annotation": None if annotation is None
                      else orjson.dumps(annotation).decode(),
                      "file": Path(file).name if isinstance(file, str) else None,
                      "data": data})
    return video_rows().normalize({
        "id": index, "source": source, "status": "ok", "cause": None,
        "metadata": _metadata(value), "duration_s": value.get("duration_s"),
        "fps": value.get("fps"), "width": value.get("width"), "height": value.get("height"),
        "cuts": value.get("cuts"), "clips": clips, "run_id": run_id, "config": config})


SLIM_DROP = ("markdown", "blocks", "figures", "clips", "run_id", "config")


def slim_row(row: dict[str, Any]) -> dict[str, Any]:
    """A shard row as its ``documents.jsonl``/``videos.jsonl`` line: counts, not content."""
    out = {k: v for k, v in row.items() if k not in SLIM_DROP}
    if isinstance(row.get("pages"), list):
        out["pages"] = len(row["pages"])
    if isinstance(row.get("clips"), list):
        out["clips"] = len(row["clips"])
    return out


__all__ = ["job_rows", "pdf_rows", "video_rows", "page_chars", "pdf_row", "slim_row", "video_row"]
