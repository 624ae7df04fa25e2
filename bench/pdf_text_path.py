"""The PDF text path: plain PyMuPDF, rayorch's renderer, ``rayorch run pdf``, pymupdf4llm.

    python scripts/fetch_corpus.py --all              # the Debian doc packages
    python bench/pdf_text_path.py --pages 2000        # -> bench/out/pdf_text_path.json

Corpus: readable PDFs of the fetched packages, in file order, until ``--pages`` pages
(files over ``--max-doc-pages`` pages are skipped so one book does not dominate).
Measured, on the same files:

* ``plain``: one process, ``page.get_text()`` per page (the floor for text extraction);
* ``render``: one process, ``RenderPdf(ocr_fallback=True)``: Markdown of every text page
  (and how many pages ``--ocr auto`` would OCR);
* ``cli``: ``rayorch run pdf --ocr text --json`` in a subprocess: start-up (Ray, pools)
  and the run itself, reported apart;
* ``pymupdf4llm``: ``pymupdf4llm.to_markdown`` (1.28.2, which needs PyMuPDF 1.28.2: give
  its site directory with ``--p4l-site``) on the first ``--p4l-pages`` pages.

Output quality on the pymupdf4llm subset: word recall/precision against ``get_text()``
(bare numbers and Markdown markup aside), headings, list items and tables found.
"""

from __future__ import annotations

import argparse
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
CACHE = REPO / ".cache" / "corpus"
OUT = REPO / "bench" / "out"

P4L_SCRIPT = r"""
import json, sys, time
import pymupdf, pymupdf4llm
pymupdf.TOOLS.mupdf_display_errors(False)
files = json.loads(sys.argv[1]); out = {}
t = time.perf_counter(); pages = 0
for f in files:
    md = pymupdf4llm.to_markdown(f, show_progress=False)
    out[f] = md
    with pymupdf.open(f) as d:
        pages += d.page_count
print(json.dumps({"seconds": time.perf_counter() - t, "pages": pages, "markdown": out}))
"""


def pick(pages: int, max_doc_pages: int) -> list[tuple[str, int]]:
    chosen: list[tuple[str, int]] = []
    total = 0
    for manifest in sorted(CACHE.glob("*/manifest.json")):
        entries = json.loads(manifest.read_text())["pdfs"]
        for entry in sorted(entries, key=lambda e: e["file"]):
            if 0 < entry["pages"] <= max_doc_pages and total < pages:
                chosen.append((str(manifest.parent / entry["file"]), entry["pages"]))
                total += entry["pages"]
    if total < pages:
        sys.exit(f"only {total} pages cached under {CACHE}: python scripts/fetch_corpus.py --all")
    return chosen


def plain(files: list[str]) -> dict[str, Any]:
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    t = time.perf_counter()
    pages = 0
    for f in files:
        with pymupdf.open(f) as doc:
            for page in doc:
                page.get_text()
                pages += 1
    seconds = time.perf_counter() - t
    return {"pages": pages, "seconds": round(seconds, 2), "pages_per_s": round(pages / seconds)}


def render(files: list[str]) -> dict[str, Any]:
    from rayorch.pipelines.pdf import RenderPdf

    renderer = RenderPdf(ocr_fallback=True)
    t = time.perf_counter()
    pages = to_ocr = failed = 0
    for f in files:
        [result] = renderer([f])
        if isinstance(result, tuple):
            pages += result[1]["page_count"]
            to_ocr += len(result[0])
        else:
            failed += 1
    seconds = time.perf_counter() - t
    return {"pages": pages, "seconds": round(seconds, 2), "pages_per_s": round(pages / seconds),
            "auto_would_ocr_pages": to_ocr, "failed_documents": failed}


def cli(input_dir: Path, render_replicas: int | None) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="pdfbench-out-"))
    argv = [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", str(input_dir),
            "--output", str(out), "--ocr", "text", "--json", "--no-progress",
            "--allow-failures"]
    if render_replicas:
        argv += ["--render-replicas", str(render_replicas)]
    t = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        sys.exit(f"rayorch run pdf failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    keep = ("documents", "failed", "pages", "ray_start_s", "pools_start_s", "startup_s", "run_s",
            "pages_per_s", "wall_s")
    return {**{k: summary[k] for k in keep}, "process_wall_s": round(wall, 2)}


def structure(markdown: str) -> dict[str, int]:
    lines = markdown.splitlines()
    return {"headings": sum(1 for x in lines if re.match(r"^#{2,6} ", x)),
            "list_items": sum(1 for x in lines if re.match(r"^\s*([-*+]|\d+\.) ", x)),
            "table_rows": sum(1 for x in lines if x.startswith("|"))}


def quality(files: list[str], p4l_markdown: dict[str, str]) -> dict[str, Any]:
    import pymupdf

    from rayorch.pipelines.pdf import AssembleDocument, RenderPdf
    from rayorch.testing import shared_share, text_words

    ours: dict[str, str] = {}
    for f in files:
        [(_, meta)] = RenderPdf()([f])
        [doc] = AssembleDocument()([[]], [meta])
        ours[f] = doc["markdown"]
    result: dict[str, Any] = {}
    for name, texts in (("rayorch", ours), ("pymupdf4llm", p4l_markdown)):
        totals = {"headings": 0, "list_items": 0, "table_rows": 0}
        recalls, precisions = [], []
        for f in files:
            with pymupdf.open(f) as doc:
                expected = text_words("\n".join(page.get_text() for page in doc))
            recall, precision = shared_share(expected, text_words(texts.get(f, "")))
            recalls.append(recall)
            precisions.append(precision)
            for key, value in structure(texts.get(f, "")).items():
                totals[key] += value
        result[name] = {"word_recall": round(sum(recalls) / len(recalls), 3),
                        "word_precision": round(sum(precisions) / len(precisions), 3),
                        **totals}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--max-doc-pages", type=int, default=200)
    parser.add_argument("--p4l-pages", type=int, default=150)
    parser.add_argument("--p4l-site", default="/tmp/p4l-site",
                        help="site directory holding pymupdf4llm 1.28.2 and pymupdf 1.28.2")
    parser.add_argument("--render-replicas", type=int, default=None)
    parser.add_argument("--skip", nargs="*", default=[], choices=["plain", "render", "cli", "p4l"])
    args = parser.parse_args()

    chosen = pick(args.pages, args.max_doc_pages)
    files = [f for f, _ in chosen]
    input_dir = Path(tempfile.mkdtemp(prefix="pdfbench-in-"))
    for i, f in enumerate(files):
        os.symlink(f, input_dir / f"{i:04d}-{Path(f).name}")
    report: dict[str, Any] = {"documents": len(files), "pages": sum(n for _, n in chosen),
                              "load_before": os.getloadavg()[0], "cpus": os.cpu_count()}
    if "plain" not in args.skip:
        report["plain"] = plain(files)
    if "render" not in args.skip:
        report["render"] = render(files)
    if "cli" not in args.skip:
        report["cli"] = cli(input_dir, args.render_replicas)
    if "p4l" not in args.skip and Path(args.p4l_site).is_dir():
        subset, count = [], 0
        for f, n in chosen:
            if count < args.p4l_pages:
                subset.append(f)
                count += n
        done = subprocess.run([sys.executable, "-c", P4L_SCRIPT, json.dumps(subset)],
                              capture_output=True, text=True, check=False,
                              env={**os.environ, "PYTHONPATH": args.p4l_site})
        if done.returncode == 0:
            p4l = json.loads(done.stdout.strip().splitlines()[-1])
            report["pymupdf4llm"] = {"pages": p4l["pages"], "seconds": round(p4l["seconds"], 2),
                                     "pages_per_s": round(p4l["pages"] / p4l["seconds"], 2)}
            t = time.perf_counter()
            ours = render(subset)
            report["render_on_p4l_subset"] = {**ours, "seconds": round(time.perf_counter() - t, 2)}
            report["quality_on_p4l_subset"] = quality(subset, p4l["markdown"])
        else:
            report["pymupdf4llm"] = {"error": done.stderr[-1000:]}
    report["load_after"] = os.getloadavg()[0]
    shutil.rmtree(input_dir, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "pdf_text_path.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
