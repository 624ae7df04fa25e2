#!/usr/bin/env python3
"""Pages/s of the PDF pipeline's modules per OCR engine, called directly in one process.

No Ray and no lineage store: this measures the work inside the modules (render,
OCR, assemble), the floor under any runtime. Needs the corpus first::

    python scripts/fetch_corpus.py
    python scripts/bench_pdf_engines.py --engines text rapidocr --count 20
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from fetch_corpus import fetch_package  # a sibling script: scripts/ is on sys.path

from rayorch.core.outcome import RecordFailure
from rayorch.pipelines.document.ocr import engine_needs_image
from rayorch.pipelines.document.page_ocr import PageText
from rayorch.pipelines.pdf import AssembleDocument, OcrPage, RenderPdf


def pick_corpus(cache: Path, package: str, count: int, max_pages: int) -> list[str]:
    """``count`` PDFs spread evenly over the package's name order, each at most ``max_pages``."""
    manifest = fetch_package(package, cache)
    usable = [e for e in manifest["pdfs"] if 0 < e["pages"] <= max_pages]
    step = max(1, len(usable) // count)
    return [str(cache / package / e["file"]) for e in usable[::step][:count]]


def run_engine(engine: str, paths: list[str], *, dpi: int, batch_size: int) -> dict[str, Any]:
    """Time render, OCR and assembly of ``paths`` with ``engine``; return the figures."""
    started = time.perf_counter()
    ocr = OcrPage(engine)
    build_s = time.perf_counter() - started

    started = time.perf_counter()
    rendered = RenderPdf(needs_image=engine_needs_image(engine), dpi=dpi)(paths)
    render_s = time.perf_counter() - started
    documents = [r for r in rendered if not isinstance(r, RecordFailure)]
    pages = [page for doc_pages, _ in documents for page in doc_pages]

    started = time.perf_counter()
    texts: list[PageText | RecordFailure] = []
    for i in range(0, len(pages), batch_size):
        texts += ocr(pages[i : i + batch_size])
    ocr_s = time.perf_counter() - started

    started = time.perf_counter()
    per_doc, at = [], 0
    for doc_pages, _ in documents:
        per_doc.append([t for t in texts[at : at + len(doc_pages)] if isinstance(t, dict)])
        at += len(doc_pages)
    AssembleDocument()(per_doc, [meta for _, meta in documents])
    assemble_s = time.perf_counter() - started

    total_s = render_s + ocr_s + assemble_s
    # The text engine's pages never reach OcrPage (RenderPdf writes their Markdown).
    all_pages = sum(int(meta["page_count"]) for _, meta in documents)
    return {
        "engine": engine, "pdfs": len(paths), "failed": len(paths) - len(documents),
        "pages": all_pages, "build_s": build_s, "render_s": render_s, "ocr_s": ocr_s,
        "assemble_s": assemble_s, "pages_per_s": all_pages / total_s,
        "ocr_pages_per_s": len(pages) / ocr_s if pages and ocr_s > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", default=["text", "rapidocr"])
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/corpus"))
    parser.add_argument("--package", default="texlive-humanities-doc")
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--max-pages", type=int, default=40)
    parser.add_argument("--dpi", type=int, default=110)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    paths = pick_corpus(args.cache_dir, args.package, args.count, args.max_pages)
    print(f"{len(paths)} PDFs from {args.package}; {os.cpu_count()} CPUs; "
          f"load average before {os.getloadavg()[0]:.2f}")
    print("| engine | PDFs | pages | render s | OCR s | assemble s | pages/s | OCR pages/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for engine in args.engines:
        r = run_engine(engine, paths, dpi=args.dpi, batch_size=args.batch_size)
        ocr_only = f"{r['ocr_pages_per_s']:.2f}" if r["ocr_pages_per_s"] else "(no OCR work)"
        print(f"| {engine} | {r['pdfs']} | {r['pages']} | {r['render_s']:.2f} | {r['ocr_s']:.2f} "
              f"| {r['assemble_s']:.3f} | {r['pages_per_s']:.2f} | {ocr_only} |", flush=True)
    print(f"load average after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
