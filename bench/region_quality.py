"""Tables, headings and figures of `--ocr layout`'s models beside `--ocr auto --tables` and
pymupdf4llm, on born-digital documents and their scanned copies.

    pip install -e ".[pdf,layout]"                 # pymupdf4llm too, when installable
    python bench/region_quality.py                 # -> bench/out/region_quality.json

The set is :mod:`bench.region_set` (3 documents, 2 pages each: a title and two section
headings, two ruled 5x3 tables, one raster figure; the scanned copies have every page as a
150-dpi image and no text layer). Scores, per corpus, over the whole set:

* **tables in place**: a labeled table is right when one table of the Markdown (a pipe table,
  or an HTML ``<table>``) has at least 75% of its cells at the same row and column with the
  same text (texts compared as :func:`bench.markdown_quality.norm` does); each found table
  counts once;
* **headings**: the labeled title and section headings found as Markdown heading lines (any
  level; a near match, difflib ratio >= 0.9, counts);
* **figures**: image references (``![..](..)`` or ``<img``) up to the labeled figure count.

Tools: ``layout`` (the modules of ``--ocr layout`` called in this process:
:class:`~rayorch.pipelines.document.region_render.RenderLayoutPages`,
:class:`~rayorch.pipelines.document.layout.DetectLayout`,
:class:`~rayorch.pipelines.document.recognise.RecogniseRegion`, then the job's page and
document assembly, figures written as PNG files), ``auto-tables`` (``rayorch run pdf --ocr auto
--tables``, a private local Ray), ``layout-job`` (``rayorch run pdf --ocr layout``, the same
way: its scores and end-to-end pages/s, Ray's start included), ``pymupdf4llm`` (as
installed, in a subprocess). Speed of ``layout``: pages/s and regions/s of layout +
recognition per corpus, the models loaded first and one page run untimed; the machine's
cores are shared by whatever else runs.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.markdown_quality import _match, norm, run_tool, structures  # noqa: E402
from bench.region_set import build_set  # noqa: E402

SET_DIR = REPO / ".cache" / "region_set"
OUT = REPO / "bench" / "out"
TOOLS = ("layout", "layout-job", "auto-tables", "pymupdf4llm")
CORPORA = ("born-digital", "scanned")
IN_PLACE = 0.75
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
_HTML_TABLE = re.compile(r"<table.*?</table>", re.DOTALL | re.IGNORECASE)
_HTML_ROW = re.compile(r"<tr.*?</tr>", re.DOTALL | re.IGNORECASE)
_HTML_CELL = re.compile(r"<t[dh][^>]*>(.*?)</t[dh]>", re.DOTALL | re.IGNORECASE)
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]+\)|<img\b", re.IGNORECASE)


# -- scores ---------------------------------------------------------------------------------


def markdown_tables(markdown: str) -> list[list[list[str]]]:
    """The pipe tables and HTML tables of a Markdown text, each as its rows of cell texts."""
    tables: list[list[list[str]]] = list(structures(markdown)["tables"])
    for found in _HTML_TABLE.findall(markdown):
        tables.append([[html.unescape(re.sub(r"<[^>]+>", " ", cell)).strip()
                        for cell in _HTML_CELL.findall(row)] for row in _HTML_ROW.findall(found)])
    return tables


def cells_in_place(found: list[list[str]], label: list[list[str]]) -> float:
    """The share of ``label``'s cells that ``found`` has at the same row and column."""
    total = sum(len(row) for row in label)
    right = sum(1 for r, row in enumerate(label) for c, cell in enumerate(row)
                if r < len(found) and c < len(found[r]) and norm(found[r][c]) == norm(cell))
    return right / max(total, 1)


def tables_in_place(markdown: str, labeled: list[list[list[str]]], share: float = IN_PLACE
                    ) -> int:
    """How many labeled tables the Markdown has with at least ``share`` of cells in place."""
    pool = markdown_tables(markdown)
    right = 0
    for label in labeled:
        scores = [cells_in_place(found, label) for found in pool]
        if scores and max(scores) >= share:
            del pool[scores.index(max(scores))]
            right += 1
    return right


def score_document(markdown: str, label: dict[str, Any]) -> dict[str, list[int]]:
    """``[right, labeled]`` per score for one document."""
    headings = [label["title"], *(text for _, text in label["headings"])]
    found = [norm(h) for h in _HEADING.findall(markdown)]
    return {
        "tables": [tables_in_place(markdown, label["tables"]), len(label["tables"])],
        "headings": [_match(found, [norm(h) for h in headings]), len(headings)],
        "figures": [min(len(_IMAGE.findall(markdown)), label["figures"]), label["figures"]],
    }


def score(markdowns: list[str], labels: list[dict[str, Any]]) -> dict[str, list[int]]:
    totals = {"tables": [0, 0], "headings": [0, 0], "figures": [0, 0]}
    for markdown, label in zip(markdowns, labels, strict=True):
        for name, (right, labeled) in score_document(markdown, label).items():
            totals[name] = [totals[name][0] + right, totals[name][1] + labeled]
    return totals


# -- the layout models, applied directly ------------------------------------------------------


def run_layout(pdfs: list[Path], figures: Path) -> tuple[list[str], dict[str, Any]]:
    """Markdown per PDF from layout + recognition, and their speed: the job's own modules
    (render, the two models, page and document assembly) called in this process."""
    from rayorch import RecordFailure
    from rayorch.pipelines.document.layout import DROPPED_KINDS, DetectLayout
    from rayorch.pipelines.document.recognise import RecogniseRegion
    from rayorch.pipelines.document.region_assemble import (
        AssembleRegionDocument,
        assemble_page,
    )
    from rayorch.pipelines.document.region_render import RenderLayoutPages

    started = time.perf_counter()
    render, detect, recognise = RenderLayoutPages(), DetectLayout(), RecogniseRegion()
    loaded = time.perf_counter() - started
    [(items, _, _)] = render([str(pdfs[0])])  # warm-up, untimed: ONNX Runtime's first runs
    [regions] = detect(items[:1])
    recognise([r for r in regions if r["kind"] not in DROPPED_KINDS][:3])
    assemble = AssembleRegionDocument(page_markers=False)
    markdowns, pages, regions_done, layout_s, recognise_s, failures = [], 0, 0, 0.0, 0.0, 0
    for path in pdfs:
        [(items, numbers, meta)] = render([str(path)])
        t0 = time.perf_counter()
        per_page = detect(items)
        t1 = time.perf_counter()
        wanted = [[r for r in page if r["kind"] not in DROPPED_KINDS]
                  for page in per_page if not isinstance(page, RecordFailure)]
        blocks = recognise([r for page in wanted for r in page])
        t2 = time.perf_counter()
        layout_s, recognise_s = layout_s + t1 - t0, recognise_s + t2 - t1
        pages, regions_done = pages + len(items), regions_done + len(blocks)
        failures += sum(isinstance(x, RecordFailure) for x in [*per_page, *blocks])
        good = [b for b in blocks if not isinstance(b, RecordFailure)]
        done = [assemble_page([b for b in good if b["page"] == n], n, meta["figure_stem"])
                for n in numbers]
        [document] = assemble([done], [meta])
        for name, png in document["figures"].items():
            (figures / name).parent.mkdir(parents=True, exist_ok=True)
            (figures / name).write_bytes(png)
        markdowns.append(document["markdown"])
    total = layout_s + recognise_s
    return markdowns, {
        "pages": pages, "regions": regions_done, "failures": failures,
        "load_s": round(loaded, 2), "layout_s": round(layout_s, 2),
        "recognise_s": round(recognise_s, 2),
        "pages_per_s": round(pages / total, 3), "regions_per_s": round(regions_done / total, 3),
    }


# -- the other tools ----------------------------------------------------------------------------


def run_job(pdfs: list[Path], ocr: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Markdown per PDF from one ``rayorch run pdf`` over all of them (a private local Ray),
    and its end-to-end seconds and pages/s (Ray's start included)."""
    import pymupdf

    pages = 0
    for path in pdfs:
        with pymupdf.open(path) as doc:
            pages += doc.page_count
    with tempfile.TemporaryDirectory() as tmp:
        source, out = Path(tmp) / "in", Path(tmp) / "out"
        source.mkdir()
        for path in pdfs:
            shutil.copy(path, source / path.name)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", str(source),
             "--output", str(out), *ocr, "--no-progress"],
            capture_output=True, text=True, cwd=REPO, timeout=3600,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"rayorch run pdf failed: {done.stderr.strip()[-300:]}")
        markdowns = []
        for path in pdfs:  # the job names its files NNNNN-<stem>.md
            found = sorted(out.rglob(f"*{path.stem}.md"))
            markdowns.append(found[0].read_text() if found else "")
    return markdowns, {"e2e_s": round(seconds, 1), "e2e_pages_per_s": round(pages / seconds, 3)}


def run_auto_tables(pdfs: list[Path]) -> tuple[list[str], dict[str, Any]]:
    return run_job(pdfs, ["--ocr", "auto", "--tables"])


def run_layout_job(pdfs: list[Path]) -> tuple[list[str], dict[str, Any]]:
    return run_job(pdfs, ["--ocr", "layout"])


def run_pymupdf4llm(pdfs: list[Path]) -> tuple[list[str], dict[str, Any]]:
    results = run_tool("pymupdf4llm", [{"path": str(p), "pages": None} for p in pdfs])
    return [r["markdown"] for r in results], {
        "convert_s": round(sum(r["seconds"] for r in results), 2)}


RUNNERS = {"layout-job": run_layout_job, "auto-tables": run_auto_tables,
           "pymupdf4llm": run_pymupdf4llm}


def measure(tools: tuple[str, ...] = TOOLS, documents: int | None = None) -> dict[str, Any]:
    """Scores (and speeds) of each tool on each corpus; a tool that cannot run is said so."""
    docs = build_set(SET_DIR, **({"documents": documents} if documents else {}))
    labels = [label for _, _, label in docs]
    corpora = {"born-digital": [p for p, _, _ in docs], "scanned": [s for _, s, _ in docs]}
    report: dict[str, Any] = {"documents": len(docs), "results": {}}
    figures = OUT / "region_figures"
    figures.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        for corpus, pdfs in corpora.items():
            try:
                if tool == "layout":
                    markdowns, speed = run_layout(pdfs, figures)
                else:
                    markdowns, speed = RUNNERS[tool](pdfs)
            except Exception as exc:  # a tool that does not install or run here: said
                report["results"][f"{tool}/{corpus}"] = {"error": str(exc)[:300]}
                continue
            report["results"][f"{tool}/{corpus}"] = {"scores": score(markdowns, labels),
                                                     **speed}
    return report


def table(report: dict[str, Any]) -> str:
    """The scores as a Markdown table: one row per tool, born-digital and scanned columns."""
    head = ["| tool | corpus | tables >= 75% cells in place | headings as headings | "
            "figures as images | pages/s | regions/s |", "| --- | --- | ---: | ---: | ---: |"
            " ---: | ---: |"]
    rows = []
    for key, result in report["results"].items():
        tool, corpus = key.split("/")
        if "error" in result:
            rows.append(f"| {tool} | {corpus} | not run: {result['error']} |  |  |  |  |")
            continue
        s = result["scores"]
        cells = [f"{s[name][0]}/{s[name][1]}" for name in ("tables", "headings", "figures")]
        rows.append(f"| {tool} | {corpus} | " + " | ".join(cells)
                    + f" | {result.get('pages_per_s', '-')} | {result.get('regions_per_s', '-')} |")
    return "\n".join(head + rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated, of {', '.join(TOOLS)}")
    parser.add_argument("--documents", type=int, default=None)
    parser.add_argument("--json", type=Path, default=OUT / "region_quality.json")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load_before = round(os.getloadavg()[0], 2)
    report = measure(tuple(args.tools.split(",")), args.documents)
    report["load_before"], report["load_after"] = load_before, round(os.getloadavg()[0], 2)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"{report['documents']} documents per corpus; load average {load_before} before, "
          f"{report['load_after']} after; {os.cpu_count()} cores")
    print(table(report))
    for key, result in report["results"].items():
        extra = {k: v for k, v in result.items() if k != "scores"}
        print(f"{key}: {extra}")
    print(f"\n{time.perf_counter() - started:.1f} s; JSON in {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
