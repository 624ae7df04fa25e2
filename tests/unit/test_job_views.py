"""The rows and lines views of a job's output: id order, and no row per source held."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rayorch.pipelines.job.layouts import job_layout
from rayorch.pipelines.job.views import write_views
from rayorch.storage import open_storage
from rayorch.store.records.sink import SinkError


def shuffled_rows(n: int) -> Iterator[tuple[int, dict[str, Any]]]:
    """``n`` video rows with a line each, in an order far from id order (as parts give them)."""
    for k in range(n):
        index = (k * 7919) % n  # 7919 is prime: a permutation of range(n) for n not its multiple
        yield index, {"id": index, "source": f"s3://corpus/v{index:07d}.mp4", "status": "ok",
                      "note": "x" * 200,
                      "lines": [{"video": index, "clip": 0, "file": f"clips/{index}.mp4"}]}


def test_views_come_out_in_id_order_with_their_lines(tmp_path: Path) -> None:
    counts = write_views(open_storage(tmp_path), job_layout("video"), shuffled_rows(1000))
    rows = [json.loads(line) for line in (tmp_path / "videos.jsonl").read_text().splitlines()]
    lines = [json.loads(line) for line in (tmp_path / "clips.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(1000))
    assert all("lines" not in r for r in rows)
    assert [c["video"] for c in lines] == list(range(1000))
    assert (counts.rows, counts.lines) == (1000, 1000)


def test_writing_the_views_of_many_sources_holds_no_row_per_source(tmp_path: Path) -> None:
    """50,000 rows of ~330 B: held in dicts they are ~40 MB of Python objects, and their
    text another 16 MB; the views are written holding a few MB whatever the count."""
    n = 50_000
    tracemalloc.start()
    try:
        write_views(open_storage(tmp_path), job_layout("video"), shuffled_rows(n))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB of Python objects"
    with open(tmp_path / "videos.jsonl") as f:
        assert sum(1 for _ in f) == n


def test_a_source_twice_is_refused(tmp_path: Path) -> None:
    rows = [(0, {"id": 0}), (1, {"id": 1}), (0, {"id": 0})]
    with pytest.raises(SinkError, match="source 0 is in two part files"):
        write_views(open_storage(tmp_path), job_layout("pdf"), rows)
