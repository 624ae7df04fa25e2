"""The rows file and the lines file of a job's output, written in id order when a run ends.

The part files hold each source's row in delivery order, part by part. ``documents.jsonl``
(``videos.jsonl``) lists them in id order, and ``clips.jsonl`` the lines the rows hold.
Both are written from a stream of ``(id, row)``: the rows go through a local spill
(:class:`~rayorch.runtime.id_spill.IdSpill`) that gives them back in id order, the views go
to local temporary files, then each to the output in one replacing write
(``Storage.put_file``: multipart on an object store). The driver holds neither a row per
source nor a view's text: a run over a million sources writes them in a few tens of MB.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rayorch.pipelines.job.layouts import JobLayout
from rayorch.runtime.id_spill import IdSpill
from rayorch.storage import Storage
from rayorch.store.records.sink import SinkError

LINES_KEY = "lines"
"""The key of a row that holds the source's lines (``layout.lines``); not in the rows file."""


@dataclass(frozen=True)
class ViewCounts:
    """What the views hold: rows, lines, and rows that name a file of their own."""

    rows: int
    lines: int
    files: int


def write_views(storage: Storage, layout: JobLayout, rows: Iterable[tuple[int, dict[str, Any]]]
                ) -> ViewCounts:
    """Write ``layout.rows`` (and ``layout.lines``) from ``rows`` (any order) in id order;
    :class:`SinkError` when an id comes twice, ``StorageError`` when a write fails."""
    with IdSpill() as spill:
        for index, row in rows:
            if not spill.add(index, orjson.dumps(row)):
                raise SinkError(f"source {index} is in two part files of {storage.url}; "
                                "`rayorch audit RUN --out-dir DIR` names the part no fact "
                                "references")
        count = lines = files = 0
        with tempfile.TemporaryDirectory(prefix="rayorch-views-") as tmp:
            rows_path, lines_path = Path(tmp) / "rows", Path(tmp) / "lines"
            with open(rows_path, "wb") as rows_file, open(lines_path, "wb") as lines_file:
                for _, body in spill.items():
                    row = orjson.loads(body)
                    mine = row.pop(LINES_KEY, ())
                    rows_file.write(_line(row))
                    for line in mine:
                        lines_file.write(_line(line))
                    count += 1
                    lines += len(mine)
                    files += own_file(layout, row)
            storage.put_file(layout.rows, rows_path)
            if layout.lines:
                storage.put_file(layout.lines, lines_path)
    return ViewCounts(rows=count, lines=lines, files=files)


def own_file(layout: JobLayout, row: dict[str, Any]) -> bool:
    """Whether ``row`` names a file of its own (``layout.file_field``: the ``.md``)."""
    return layout.file_field is not None and isinstance(row.get(layout.file_field), str)


def _line(value: Any) -> bytes:
    return (json.dumps(value, ensure_ascii=False) + "\n").encode("utf-8")


__all__ = ["LINES_KEY", "ViewCounts", "own_file", "write_views"]
