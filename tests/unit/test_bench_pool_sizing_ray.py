"""bench/pool_sizing_ray.py's pure helpers: the grid of static splits, the corpus choice,
the sizer's line and the tables (no Ray here)."""

from __future__ import annotations

from typing import Any

from bench.pool_sizing_ray import (
    DEFAULT_SPLIT,
    best_static,
    grid,
    most_actors,
    page_rate,
    parse_sizer_line,
    pick,
    pools_text,
    summarize,
    table,
    variant_name,
)


def test_grid_holds_every_split_whose_declared_cpus_fit() -> None:
    # render 1 CPU, OCR 0.5, assemble 0.25: on 4 CPUs render 1 leaves room for 5 OCR
    # actors, render 2 for 3, render 3 for 1.
    assert grid(4) == [(1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (2, 1), (2, 2), (2, 3), (3, 1)]
    assert DEFAULT_SPLIT in grid(4)
    assert grid(2) == [(1, 1)]
    assert grid(1) == []
    for render, ocr in grid(8):
        assert render * 1.0 + ocr * 0.5 + 0.25 <= 8


def test_most_actors_beside_the_other_stages() -> None:
    assert most_actors(4, 1.0, 0.75) == 3
    assert most_actors(4, 0.5, 1.25) == 5
    assert most_actors(1, 1.0, 0.75) == 1  # never under one


def test_pick_takes_documents_in_order_within_the_page_bounds() -> None:
    entries = [("a.pdf", 10), ("b.pdf", 300), ("c.pdf", 1), ("d.pdf", 5)]
    assert pick(entries, 12, 200) == [(0, "a.pdf", 10), (0, "c.pdf", 1), (0, "d.pdf", 5)]
    assert pick(entries, 12, 200, min_doc_pages=2) == [(0, "a.pdf", 10), (0, "d.pdf", 5)]
    # without cycle: what there is; with it, the list again as copy 1
    assert pick(entries, 40, 200, min_doc_pages=2) == [(0, "a.pdf", 10), (0, "d.pdf", 5)]
    assert pick(entries, 20, 200, min_doc_pages=2, cycle=True) == [
        (0, "a.pdf", 10), (0, "d.pdf", 5), (1, "a.pdf", 10)]
    assert pick([("b.pdf", 300)], 10, 200, cycle=True) == []  # nothing usable: no loop


def test_parse_sizer_line() -> None:
    line = ("rayorch: pools: render 1->3->3 (2 changes); bound by render (80% of the "
            "decisions' time); 4 decisions, 0.31 ms each\n")
    assert parse_sizer_line("other\n" + line) == {
        "decisions": 4, "decision_ms": 0.31, "bound_share": 0.8}
    assert parse_sizer_line("rayorch: run X\n") == {}


def _row(variant: str, kind: str, wall: float, pps: float, **extra: Any) -> dict[str, Any]:
    return {"variant": variant, "kind": kind, "wall_s": wall, "pages_per_s": pps,
            "after_ray_pages_per_s": pps / 2, **extra}


def test_summarize_best_static_and_the_table() -> None:
    pools = {"render": {"start": 1, "most": 3, "end": 2}, "ocr": {"start": 1, "most": 1,
                                                                 "end": 1}}
    rows = [
        _row("auto", "auto", 10.0, 100.0, pools=pools, bound_by="render", decisions=3,
             decision_ms=0.2),
        _row("auto", "auto", 12.0, 80.0, pools=pools, bound_by="ocr", decisions=4,
             decision_ms=0.4),
        _row("r2:o1", "static", 20.0, 50.0),
        _row("r1:o1", "static", 15.0, 70.0),
        _row("raydata", "raydata", 40.0, 25.0),
    ]
    stats = summarize(rows)
    assert stats["auto"]["runs"] == 2
    assert stats["auto"]["wall_s"] == {"min": 10.0, "median": 11.0}
    assert stats["auto"]["pages_per_s"] == {"min": 80.0, "median": 90.0}
    assert best_static(stats) == "r1:o1"
    assert best_static({"auto": stats["auto"]}) is None
    assert pools_text(pools) == "render 1→3→2, ocr 1"
    assert pools_text(None) == ""
    text = table("scanned", stats, default="r2:o1")
    lines = text.splitlines()
    assert lines[0] == "**scanned**"
    assert lines[4].startswith("| auto | 2 | 10.0 / 11.0 | 80.0 / 90.0 | 45.0 | "
                               "render 1→3→2, ocr 1 | render/ocr | 3/4 (0.20/0.40) |")
    assert lines[5].startswith("| r1:o1 (best static) | 1 |")
    assert lines[6].startswith("| r2:o1 (default) | 1 |")
    assert lines[7].startswith("| raydata | 1 |")
    assert "| best static | r1:o1 | 0.73 | 1.29 | 1.29 |" in lines
    assert "| default static | r2:o1 | 0.55 | 1.80 | 1.80 |" in lines
    assert "| Ray Data | raydata | 0.28 | 3.60 | 3.60 |" in lines


def test_variant_names() -> None:
    assert variant_name((2, 1)) == "r2:o1"
    assert variant_name("auto") == "auto"


def test_page_rate_from_pages_and_run_time_not_the_rounded_summary() -> None:
    assert page_rate({"pages": 37, "run_s": 110.0, "pages_per_s": 0.3}) == 37 / 110.0
    assert page_rate({"pages_per_s": 12.5}) == 12.5
