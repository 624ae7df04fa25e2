"""Table structure on the generated table set (``bench/table_set.py``): adjacency-relation F1.

The score is ICDAR 2013's table-competition relation F1: for every non-empty cell, its
nearest non-empty neighbour to the right and the one below, compared as text pairs
(whitespace removed, case folded) between the truth and the answer, pooled over the set
(micro); and TEDS (PubTabNet's tree-edit-distance similarity of the HTML tables, texts
compared by normalised edit distance) and TEDS-struct (spans and shape only), each the mean
over tables. Each system gets the truth's table boxes, so these scores are the structure's
alone. The *table count* is the share of pages where the system, given the whole page, finds
as many tables as the truth holds (``--ocr layout``: the layout model's table regions that
recognition reads as tables; PyMuPDF: ``find_tables`` on the page); for ``rayorch`` also the
true tables one of those regions covers (``tables_matched``, IoU >= 0.5).

* ``rayorch``: ``RecogniseRegion`` (``--ocr layout``'s recognition step) on a region item
  cut from the page as the job cuts it (``RenderLayoutPages``, ``region_item``): born-digital
  pages with their words, scans with none (then OCR and SLANet);
* ``pymupdf-lines``, ``pymupdf-text``: PyMuPDF's ``page.find_tables(clip=box)`` with its
  ``lines`` (default) and ``text`` strategies (born-digital only: they read the text layer).

    python bench/table_quality.py --pages 24                  # this checkout's rayorch
    python bench/table_quality.py --pages 24 --rayorch /work/main --systems rayorch  # another
    python bench/table_quality.py --pages 8 --speed           # pages/s of layout + recognition
    python bench/table_quality.py --pages 12 --cpu-speed      # the same per CPU second

Results: bench/RESULTS.md, "Tables".
"""

from __future__ import annotations

import argparse
import html.parser
import json
import re
import sys
import time
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
Cells = list[list[Any]]
"""``[row, column, rowspan, colspan, text]`` per cell."""


def _norm(text: Any, fold: bool = False) -> str:
    text = re.sub(r"\s+", "", str(text or "")).casefold()
    return unicodedata.normalize("NFKC", text) if fold else text


def relations(cells: Cells, fold: bool = False) -> Counter[tuple[str, str, str]]:
    """The table's adjacency relations: per non-empty cell, its nearest non-empty neighbour
    to the right (along its top row) and below (down its first column). Texts are compared
    without whitespace, case folded; ``fold``: NFKC-folded too (``²`` as ``2``: the OCR
    model's alphabet has no superscripts; the ``f1_nfkc`` figure)."""
    grid: dict[tuple[int, int], int] = {}
    for i, (r, c, rs, cs, _) in enumerate(cells):
        for dr in range(rs):
            for dc in range(cs):
                grid.setdefault((r + dr, c + dc), i)
    if not grid:
        return Counter()
    rows = max(r for r, _ in grid) + 1
    cols = max(c for _, c in grid) + 1
    out: Counter[tuple[str, str, str]] = Counter()
    for i, (r, c, rs, cs, text) in enumerate(cells):
        if not _norm(text):
            continue
        for direction, steps in (("R", [(r, x) for x in range(c + cs, cols)]),
                                 ("D", [(y, c) for y in range(r + rs, rows)])):
            for spot in steps:
                j = grid.get(spot)
                if j is not None and j != i and _norm(cells[j][4]):
                    out[(_norm(text, fold), _norm(cells[j][4], fold), direction)] += 1
                    break
    return out


class _HtmlTable(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[int, int, str]]] = []
        self._cell: list[Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            a = dict(attrs)
            self._cell = [int(a.get("rowspan") or 1), int(a.get("colspan") or 1), ""]

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append((self._cell[0], self._cell[1], self._cell[2]))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell[2] += data


def html_cells(text: str) -> Cells:
    """The cells of an HTML table, placed on its grid (spans honoured)."""
    parser = _HtmlTable()
    parser.feed(text)
    taken: set[tuple[int, int]] = set()
    cells: Cells = []
    for r, row in enumerate(parser.rows):
        c = 0
        for rs, cs, body in row:
            while (r, c) in taken:
                c += 1
            cells.append([r, c, rs, cs, body])
            taken.update((r + dr, c + dc) for dr in range(rs) for dc in range(cs))
            c += cs
    return cells


def markdown_cells(text: str) -> Cells:
    """The cells of a Markdown pipe table (its separator line dropped)."""
    rows = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    cells: Cells = []
    r = 0
    for line in rows:
        parts = [p.strip().replace("\\|", "|") for p in re.split(r"(?<!\\)\|", line)[1:-1]]
        if parts and all(re.fullmatch(r":?-{3,}:?", p) for p in parts):
            continue
        cells += [[r, c, 1, 1, p] for c, p in enumerate(parts)]
        r += 1
    return cells


def block_cells(block: Any) -> Cells:
    """A recognised block's table cells (none for a block that fell back to text)."""
    if not isinstance(block, dict) or "table" not in block:
        return []
    table = block["table"]
    return html_cells(table["html"]) if table.get("html") else markdown_cells(
        table.get("markdown", ""))


def cells_html(cells: Cells) -> str:
    """The cells as the HTML table TEDS compares: PubTabNet's form (``<td>`` only, spans as
    ``colspan``/``rowspan``, a ``<tr>`` per grid row, each cell's whitespace collapsed)."""

    if not cells:
        return ""
    n_rows = max(r + rs for r, _, rs, _, _ in cells)
    rows: list[list[str]] = [[] for _ in range(n_rows)]
    for r, _, rs, cs, text in sorted(cells, key=lambda cell: (cell[0], cell[1])):
        attrs = (f' colspan="{cs}"' if cs > 1 else "") + (f' rowspan="{rs}"' if rs > 1 else "")
        rows[r].append(f"<td{attrs}>{html.escape(' '.join(str(text or '').split()))}</td>")
    body = "".join("<tr>" + "".join(row) + "</tr>" for row in rows)
    return f"<html><body><table>{body}</table></body></html>"


def teds(answer: Cells, truth: Cells, structure_only: bool = False) -> float:
    """TEDS (PubTabNet): ``1 - tree edit distance / the larger tree's node count`` between the
    two tables' HTML trees, a cell's rename costing its texts' normalised edit distance
    (``structure_only``: TEDS-struct, texts ignored). No table answered scores 0.

    The scorer is ``table-recognition-metric``'s ``TEDS`` (PubTabNet's own code, on
    ``apted``): the ``bench`` extra."""
    from table_recognition_metric import TEDS

    if not answer or not truth:
        return 0.0
    return float(TEDS(structure_only=structure_only)(cells_html(answer), cells_html(truth)))


def f1(tp: int, predicted: int, truth: int) -> dict[str, float]:
    p = tp / predicted if predicted else 0.0
    r = tp / truth if truth else 0.0
    return {"precision": round(p, 3), "recall": round(r, 3),
            "f1": round(2 * p * r / (p + r), 3) if p + r else 0.0}


# -- the systems -----------------------------------------------------------------------------


def rayorch_regions(pdf: Path, boxes: list[list[float]], recognise: Any, detect: Any = None
                    ) -> tuple[list[Any], int, int]:
    """Per box, ``RecogniseRegion``'s block for the region item the job would cut; the
    tables ``--ocr layout`` finds on the page by itself (``detect``'s table regions that
    ``recognise`` reads as tables; -1 without ``detect``); and how many of ``boxes`` one of
    those covers (:func:`matched`)."""
    from rayorch.pipelines.document.layout import open_png, pixel_box, region_item
    from rayorch.pipelines.document.region_render import RenderLayoutPages

    [(items, _, _)] = RenderLayoutPages()([str(pdf)])
    page = items[0]
    image = open_png(page["png"])
    words = (page.get("words") or []) if page.get("layer") == "usable" else []
    regions = []
    for i, (x0, y0, x1, y1) in enumerate(boxes):
        frac = (x0 / page["width_pt"], y0 / page["height_pt"], x1 / page["width_pt"],
                y1 / page["height_pt"])
        regions.append(region_item(page, i, "table", 1.0, frac, image.crop(pixel_box(image, frac)),
                                   words))
    found = hits = -1
    if detect is not None:
        [detected] = detect([page])
        tables = [r for r in detected if r["kind"] == "table"]
        read = [r["bbox"] for r, b in zip(tables, recognise(tables), strict=True)
                if isinstance(b, dict) and "table" in b]
        found = len(read)
        hits = matched([[x0 / page["width_pt"], y0 / page["height_pt"], x1 / page["width_pt"],
                         y1 / page["height_pt"]] for x0, y0, x1, y1 in boxes], read)
    return list(recognise(regions)), found, hits


def matched(truth: list[list[float]], found: list[list[float]]) -> int:
    """How many ``truth`` boxes one of the ``found`` boxes covers: intersection over union
    at least 0.5 (a count right by chance, one table missed and a false one found, scores
    less here)."""
    def iou(a: list[float], b: list[float]) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
        return w * h / union if union > 0 else 0.0
    return sum(1 for t in truth if any(iou(t, f) >= 0.5 for f in found))


def pymupdf_tables(pdf: Path, boxes: list[list[float]], strategy: str
                   ) -> tuple[list[Cells], int]:
    """Per box, the cells of the tables ``find_tables`` finds inside it (all of them); and the
    tables it finds on the whole page."""
    import pymupdf

    out = []
    with pymupdf.open(pdf) as doc:
        page = doc[0]
        for box in boxes:
            cells: Cells = []
            top = 0
            for table in page.find_tables(clip=pymupdf.Rect(box), strategy=strategy).tables:
                rows = table.extract()
                cells += [[top + r, c, 1, 1, t or ""] for r, row in enumerate(rows)
                          for c, t in enumerate(row)]
                top += len(rows) + 1
            out.append(cells)
        found = len(page.find_tables(strategy=strategy).tables)
    return out, found


def measure(pages: int, systems: list[str], first_seed: int = 1000, count: bool = True
            ) -> dict[str, Any]:
    """Per system and corpus: relation F1 (micro), TEDS and TEDS-struct (mean over tables),
    F1 by style, and (``count``) the share of pages whose table count is exact."""
    from bench.table_set import build_set

    data = build_set(REPO / ".cache" / "table_set", count=pages, first_seed=first_seed)
    recognise = detect = None
    if any(s.startswith("rayorch") for s in systems):
        from rayorch.pipelines.document.layout import DetectLayout
        from rayorch.pipelines.document.recognise import RecogniseRegion

        recognise = RecogniseRegion()
        detect = DetectLayout() if count else None
    report: dict[str, Any] = {}
    for system in systems:
        for corpus in (("born-digital", "scanned") if system == "rayorch" else ("born-digital",)):
            tp = predicted = truth_n = 0
            engines: Counter[str] = Counter()
            by_style: dict[str, list[int]] = {}
            scores: dict[str, list[float]] = {"teds": [], "teds_struct": []}
            exact = found_all = matched_all = 0
            folded = [0, 0, 0]  # relation F1's counts with texts NFKC-folded
            started = time.perf_counter()
            for pdf, scan, truth in data:
                boxes = [t["box"] for t in truth]
                if system == "rayorch":
                    blocks, found, hits = rayorch_regions(
                        scan if corpus == "scanned" else pdf, boxes, recognise, detect)
                    matched_all += max(hits, 0)
                    answers = [block_cells(b) for b in blocks]
                    engines.update(b.get("engine", "failed") if isinstance(b, dict)
                                   else "failed" for b in blocks)
                else:
                    answers, found = pymupdf_tables(pdf, boxes, system.split("-", 1)[1])
                exact, found_all = exact + (found == len(truth)), found_all + max(found, 0)
                for label, answer in zip(truth, answers, strict=True):
                    want, got = relations(label["cells"]), relations(answer)
                    hit = sum((want & got).values())
                    tp, predicted, truth_n = (tp + hit, predicted + sum(got.values()),
                                              truth_n + sum(want.values()))
                    row = by_style.setdefault(label["style"], [0, 0, 0])
                    row[0] += hit
                    row[1] += sum(got.values())
                    row[2] += sum(want.values())
                    want, got = relations(label["cells"], True), relations(answer, True)
                    folded[0] += sum((want & got).values())
                    folded[1] += sum(got.values())
                    folded[2] += sum(want.values())
                    scores["teds"].append(teds(answer, label["cells"]))
                    scores["teds_struct"].append(teds(answer, label["cells"], True))
            report[f"{system} {corpus}"] = {
                **f1(tp, predicted, truth_n), "f1_nfkc": f1(*folded)["f1"],
                **{k: round(sum(v) / len(v), 3) for k, v in scores.items()},
                **({"count_exact": round(exact / len(data), 3), "tables_found": found_all,
                    **({"tables_matched": matched_all} if system == "rayorch" else {})}
                   if count else {}),
                "tables": sum(len(t) for _, _, t in data), "pages": len(data),
                "seconds": round(time.perf_counter() - started, 1), "engines": dict(engines),
                "f1_by_style": {s: f1(*v)["f1"] for s, v in sorted(by_style.items())}}
    return report


def speed(pages: int) -> dict[str, Any]:
    """Pages/s of ``--ocr layout``'s render, layout and recognition on born-digital pages."""
    import tempfile

    from bench.region_quality import run_layout
    from bench.table_set import build_set

    data = build_set(REPO / ".cache" / "table_set", count=pages)
    with tempfile.TemporaryDirectory() as tmp:
        _, stats = run_layout([pdf for pdf, _, _ in data], Path(tmp))
    return stats


def cpu_speed(pages: int, repeats: int = 3) -> dict[str, Any]:
    """Pages per CPU second (``time.process_time``, every thread of this process) of
    ``--ocr layout``'s layout and recognition on born-digital pages, ONNX Runtime on one
    thread, the pages rendered and the models loaded first: the cost of the steps, less
    moved by what else runs on a shared machine than wall time. The best of ``repeats``."""
    from bench.table_set import build_set
    from rayorch.pipelines.document.layout import DROPPED_KINDS, DetectLayout
    from rayorch.pipelines.document.recognise import RecogniseRegion
    from rayorch.pipelines.document.region_render import RenderLayoutPages

    data = build_set(REPO / ".cache" / "table_set", count=pages)
    render, detect, recognise = RenderLayoutPages(), DetectLayout(threads=1), RecogniseRegion()
    items = [render([str(pdf)])[0][0][0] for pdf, _, _ in data]

    def run(some: list[Any]) -> None:
        for item in some:
            [regions] = detect([item])
            recognise([r for r in regions if r["kind"] not in DROPPED_KINDS])

    run(items[:1])  # warm
    runs = []
    for _ in range(repeats):
        started = time.process_time()
        run(items)
        runs.append(time.process_time() - started)
    return {"pages": pages, "cpu_s": [round(r, 2) for r in runs],
            "pages_per_cpu_s": round(pages / min(runs), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=24)
    parser.add_argument("--first-seed", type=int, default=1000,
                        help="the first page's seed (1000: the set tuned on; 2000: held out)")
    parser.add_argument("--systems", default="rayorch,pymupdf-lines,pymupdf-text")
    parser.add_argument("--rayorch", type=Path, default=REPO,
                        help="the checkout whose rayorch is measured (default: this one)")
    parser.add_argument("--speed", action="store_true", help="pages/s instead of F1")
    parser.add_argument("--cpu-speed", action="store_true",
                        help="pages per CPU second of layout + recognition instead of F1")
    parser.add_argument("--no-count", action="store_true",
                        help="skip the table count (the layout model on each whole page)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import bench.region_quality  # this checkout's bench, before another rayorch
    import bench.table_set  # noqa: F401

    sys.path.insert(0, str(args.rayorch.resolve()))
    import rayorch

    where = {"rayorch": str(Path(rayorch.__file__).parents[1])}
    if args.speed:
        print(json.dumps({**where, **speed(args.pages)}, indent=1))
    elif args.cpu_speed:
        print(json.dumps({**where, **cpu_speed(args.pages)}, indent=1))
    else:
        print(json.dumps({**where, **measure(args.pages, args.systems.split(","),
                                             args.first_seed, not args.no_count)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
