"""bench/admission_window.py: the orders it measures are the job's, and its runs are sound."""

from __future__ import annotations

import json
from pathlib import Path

from bench.admission_window import admitted, corpus, main, write_manifest


def order(manifest: Path, window: int, counts: list[int], scout: int = 0) -> list[int]:
    return [index for index, _values, _identity in admitted(manifest, window, counts, scout)]


def test_the_stream_orders_largest_first_within_each_window(tmp_path: Path) -> None:
    counts = [3, 9, 1, 7, 7, 2, 8]
    manifest = tmp_path / "m.jsonl"
    write_manifest(counts, manifest)
    assert order(manifest, 1, counts) == list(range(7))  # no ordering: listing order
    assert order(manifest, 3, counts) == [1, 0, 2, 3, 4, 5, 6]  # ties in listing order
    assert order(manifest, 7, counts) == [1, 6, 3, 4, 0, 5, 2]  # global: the old order
    # the proposal: the 2 largest first, then the stream without them
    assert order(manifest, 3, counts, scout=2) == [1, 6, 0, 2, 3, 4, 5]


def test_a_run_delivers_every_document_and_never_beats_the_bound(tmp_path: Path) -> None:
    main(["--docs", "200", "--workers", "4", "--pipelines", "text", "gpu", "--corpora",
          "giants-last", "--windows", "50", "--scout", "5", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "admission_window.json").read_text())
    assert [r["order"].split(" ")[0] for r in rows[:5]] == \
        ["none", "window", "window", "global", "none"]
    assert all(r["makespan_s"] >= r["bound_s"] * (1 - 1e-9) for r in rows)
    counts = corpus("giants-last", 200)
    assert counts[-10:] == [1000] * 10 and max(counts[:-10]) <= 20
