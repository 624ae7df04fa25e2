"""TEDS and TEDS-struct as ``bench/table_quality.py`` scores them, on tiny hand-made tables
whose scores are known by hand: a tree of ``<table>``, one ``<tr>`` per row and one ``<td>`` per
cell; a rename costs 1 when tag or spans differ, else the texts' normalised edit distance;
``TEDS = 1 - distance / max(nodes)``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("table_recognition_metric")

from bench.table_quality import cells_html, html_cells, markdown_cells, teds
from rayorch.pipelines.document.table_structure import table_content

# "Region" spans two rows, "Group A" two columns: 1 table + 3 rows + 7 cells = 11 nodes.
TRUTH = [[0, 0, 2, 1, "Region"], [0, 1, 1, 2, "Group A"], [1, 1, 1, 1, "Mass"],
         [1, 2, 1, 1, "Share"], [2, 0, 1, 1, "North"], [2, 1, 1, 1, "1,204"],
         [2, 2, 1, 1, "12.5"]]
NODES = 11


def changed(index: int, **what: object) -> list[list[object]]:
    cells = [list(cell) for cell in TRUTH]
    for key, value in what.items():
        cells[index][{"rowspan": 2, "colspan": 3, "text": 4}[key]] = value
    return cells


def test_identical_tables_score_one() -> None:
    assert teds(TRUTH, TRUTH) == 1.0
    assert teds(TRUTH, TRUTH, structure_only=True) == 1.0
    assert teds(TRUTH[::-1], TRUTH) == 1.0  # cells in any order: placed by row and column


def test_one_cell_text_changed_costs_its_edit_distance() -> None:
    answer = changed(1, text="Group B")  # 1 edit of 7 characters
    assert teds(answer, TRUTH) == pytest.approx(1 - (1 / 7) / NODES)
    assert teds(answer, TRUTH, structure_only=True) == 1.0
    wholly = changed(5, text="9")  # every character of "1,204" differs or is missing
    assert teds(wholly, TRUTH) == pytest.approx(1 - 1 / NODES)


def test_one_span_removed_costs_one_node_in_both_scores() -> None:
    for answer in (changed(1, colspan=1), changed(0, rowspan=1)):
        assert teds(answer, TRUTH) == pytest.approx(1 - 1 / NODES)
        assert teds(answer, TRUTH, structure_only=True) == pytest.approx(1 - 1 / NODES)


def test_a_missing_row_costs_its_nodes_and_no_answer_scores_zero() -> None:
    answer = [cell for cell in TRUTH if cell[0] != 2]  # a row and its 3 cells: 4 deletions
    assert teds(answer, TRUTH, structure_only=True) == pytest.approx(1 - 4 / NODES)
    assert teds([], TRUTH) == 0.0


def test_rayorch_tables_score_as_written() -> None:
    """A table as recognition writes it (HTML when a cell spans, a pipe table else), read
    back as the bench reads it; markup in a cell's text stays text."""
    rows = [[(1, 2), (2, 1)], [(1, 1), (1, 1)], [(1, 1), (1, 1), (1, 1)]]
    written = table_content(rows, ["Region", "Group A", "Mass", "Share", "North", "1,204",
                                   "12.5"])
    assert teds(html_cells(written["html"]), TRUTH) == 1.0
    plain = [[0, 0, 1, 1, "a <b>"], [0, 1, 1, 1, "x & y"], [1, 0, 1, 1, "1"], [1, 1, 1, 1, "2"]]
    pipe = table_content([[(1, 1), (1, 1)], [(1, 1), (1, 1)]], ["a <b>", "x & y", "1", "2"])
    assert teds(markdown_cells(pipe["markdown"]), plain) == 1.0
    assert "<td>a &lt;b&gt;</td>" in cells_html(plain)
    typo = [list(c) for c in plain]
    typo[0][4] = "a <c>"  # 1 edit of 5 characters; 1 + 2 + 4 = 7 nodes
    assert teds(typo, plain) == pytest.approx(1 - (1 / 5) / 7)
