"""The page viewer's readers of untrusted data (rayorch/ui/page_view.py): blocks from the
facts, content-list entries from a job's output, a table's HTML reduced to cells."""

from __future__ import annotations

import json
from pathlib import Path

from rayorch.ui.page_view import (
    Cell,
    content_list_regions,
    region_of_block,
    region_of_entry,
    table_cells,
)


def test_a_block_is_checked_and_its_box_put_on_the_page_grid() -> None:
    block = {"page": 1, "order": 2, "kind": "table", "bbox": [0.1, 0.2, 0.5, 0.4],
             "engine": "slanet", "fallback": None,
             "table": {"html": '<table><tr><th colspan="2" onclick="x()">Year</th></tr>'
                               '<tr><td>2024<script>bad()</script></td><td rowspan="999">'
                               '<b>7</b></td></tr></table>'}}
    region = region_of_block(block, (0, 0, 2))
    assert region is not None and region.box == (100.0, 200.0, 500.0, 400.0)
    assert region.table == ((Cell("Year", 2, 1, True),),
                            (Cell("2024bad()", 1, 1, False), Cell("7", 1, 100, False)))
    for bad in ({**block, "bbox": [0.5, 0.2, 0.1, 0.4]}, {**block, "bbox": "all"},
                {**block, "bbox": [0, 0, 1, float("nan")]}, {**block, "order": True},
                {**block, "kind": 3}, ["not", "a", "block"], None):
        assert region_of_block(bad, None) is None, bad


def test_the_content_list_of_a_delivered_document_gives_a_pages_regions(tmp_path: Path) -> None:
    entries = [{"type": "title", "text": "A", "text_level": 1, "bbox": [100, 50, 900, 90],
                "page_idx": 0, "order": 0},
               {"type": "text", "text": "table read as text", "bbox": [100, 100, 900, 300],
                "page_idx": 1, "order": 3, "fallback": "text-layer", "region_kind": "table"},
               {"type": "table", "table_body": "<table><tr><td>1</td></tr></table>",
                "bbox": [100, 400, 900, 600], "page_idx": 1, "order": 4},
               {"type": "text", "bbox": "nowhere", "page_idx": 1}]
    (tmp_path / "00000-doc.content_list.json").write_text(json.dumps(entries))
    value = {"content_list": "00000-doc.content_list.json"}
    regions = content_list_regions(str(tmp_path), value, 1)
    assert [(r.order, r.kind, r.fallback) for r in regions] == [
        (3, "table", "text-layer"), (4, "table", "")]
    assert regions[1].table == ((Cell("1"),),)
    assert content_list_regions(str(tmp_path), {"content_list": "../../etc/passwd"}, 0) == []
    assert region_of_entry({"type": "text", "bbox": [0, 0, 10, 10]}, 5).order == 5  # type: ignore[union-attr]


def test_table_cells_keep_text_and_spans_only() -> None:
    assert table_cells("<tr><td colspan=x>a</td><td>b &amp; c</td></tr>") == (
        (Cell("a"), Cell("b & c")),)
    assert table_cells("no table at all") == ()
