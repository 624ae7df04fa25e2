"""Markdown quality per structure: rayorch, pymupdf4llm and docling on a labeled set.

    pip install -e ".[pdf,bench]"                    # pymupdf4llm 1.28.2 (with PyMuPDF 1.28.2)
    python scripts/fetch_corpus.py                   # optional: the labeled corpus pages
    python bench/markdown_quality.py                 # -> bench/out/markdown_quality.json

The set: the PDFs :mod:`bench.markdown_set` generates from HTML (labels from their
descriptions) plus the hand-labeled pages of real PDFs in ``bench/markdown_labels.json``
(``examples/pdfs`` and, when fetched, the texlive corpus). Each tool converts each document
in a subprocess of its own (so one tool's imports never change another's); the same parser
reads every tool's Markdown:

* **title**: the first ``#`` heading; right when it is the whole title;
* **headings**: every other ``#``..``######`` line, right when its text and its level are:
  levels are compared by rank within a document (a tool that starts sections at ``#`` and
  one that starts at ``##`` are scored alike);
* **list items**: ``-``/``*``/``+``/``1.``/``1)`` items (nested too) outside code fences,
  an item's lazy continuation lines included; dot leaders and a trailing page number are
  ignored (a TOC entry is an item);
* **code**: fenced blocks, right when their text is the block's;
* **tables**: pipe tables, right when they have the label's rows, the label's cell count in
  every row and at least 80% of its cell texts.

Tools: ``rayorch`` (``RenderPdf``, as ``rayorch run pdf --ocr text``), ``rayorch-tables``
(``--tables``), ``pymupdf4llm`` (1.28.2 as installed, with ``pymupdf_layout``: its ONNX layout
model), ``pymupdf4llm-no-layout`` (its rule-based mode, ``use_layout(False)``) and ``docling``
(when installed). The first document of each tool's run is converted once untimed first.

Texts are compared after NFKC, case folding, and dropping Markdown emphasis and punctuation;
a near match (difflib ratio >= 0.9) counts. Precision = right / found, recall = right /
labeled, per structure over the whole set; pages/s over the generated set (the same pages
for every tool; the real PDFs are not timed, since rayorch reads whole documents).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import time
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.markdown_set import build_set  # noqa: E402

SET_DIR = REPO / ".cache" / "markdown_set"
CORPUS = REPO / ".cache" / "corpus"
LABELS = REPO / "bench" / "markdown_labels.json"
OUT = REPO / "bench" / "out"
STRUCTURES = ("title", "headings", "list_items", "code", "tables")
TOOLS = ("rayorch", "rayorch-tables", "pymupdf4llm", "pymupdf4llm-no-layout", "docling")

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+(.*)$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_LEADERS = re.compile(r"(?:\s*[.\u2026\u00b7]){3,}\s*(?:\d+|[ivxlc]+)?\s*$|\s+\d{1,4}\s*$",
                      re.IGNORECASE)
_MARKUP = re.compile(r"[*_`\\]|<br>|<[^>]+>")
_NON_WORD = re.compile(r"[\W_]+")


def norm(text: str) -> str:
    """Comparable text: NFKC, case-folded, without Markdown markup and punctuation."""
    text = _MARKUP.sub(" ", unicodedata.normalize("NFKC", text))
    return " ".join(_NON_WORD.sub(" ", text.casefold()).split())


def structures(markdown: str) -> dict[str, Any]:
    """The title, headings, list items, fenced code and pipe tables of a Markdown text."""
    found: dict[str, Any] = {"title": None, "headings": [], "list_items": [], "code": [],
                             "tables": []}
    lines = markdown.splitlines()
    i = 0
    item: list[str] | None = None
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            body = []
            i += 1
            while i < len(lines) and not _FENCE.match(lines[i]):
                body.append(lines[i])
                i += 1
            found["code"].append("\n".join(body))
            item = None
        elif line.lstrip().startswith("|"):
            rows = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                row = lines[i].strip().strip("|")
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)]
                if not all(re.fullmatch(r":?-{2,}:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            found["tables"].append(rows)
            item = None
            continue
        elif heading := _HEADING.match(line):
            level, text = len(heading.group(1)), heading.group(2)
            if level == 1 and found["title"] is None and not found["headings"]:
                found["title"] = text
            else:
                found["headings"].append([level, text])
            item = None
        elif listed := _ITEM.match(line):
            item = [listed.group(1)]
            found["list_items"].append(item)
        elif not line.strip() or line.lstrip().startswith("<!--"):
            item = None
        elif item is not None:
            item.append(line.strip())
        i += 1
    found["list_items"] = [" ".join(parts) for parts in found["list_items"]]
    return found


def _match(predicted: list[str], labeled: list[str]) -> int:
    """How many predicted texts pair with a labeled one (exact, then near), each used once."""
    left = Counter(labeled)
    unmatched = []
    right = 0
    for text in predicted:
        if left[text] > 0:
            left[text] -= 1
            right += 1
        else:
            unmatched.append(text)
    pool = list(left.elements())
    for text in unmatched:
        for k, candidate in enumerate(pool):
            matcher = difflib.SequenceMatcher(None, text, candidate, autojunk=False)
            if matcher.real_quick_ratio() >= 0.9 and matcher.ratio() >= 0.9:
                right += 1
                del pool[k]
                break
    return right


def _ranked(headings: list[list[Any]]) -> list[str]:
    ranks = {level: rank for rank, level in enumerate(sorted({h[0] for h in headings}))}
    return [f"{ranks[level]}|{norm(text)}" for level, text in headings]


def _table_key(rows: list[list[str]]) -> tuple[int, ...]:
    return tuple(len(row) for row in rows)


def _tables_right(predicted: list[list[list[str]]], labeled: list[list[list[str]]]) -> int:
    pool = list(labeled)
    right = 0
    for table in predicted:
        for k, label in enumerate(pool):
            if _table_key(table) != _table_key(label):
                continue
            cells = [(norm(a), norm(b)) for row, lrow in zip(table, label)
                     for a, b in zip(row, lrow)]
            if sum(a == b for a, b in cells) >= 0.8 * len(cells):
                right += 1
                del pool[k]
                break
    return right


def score_document(markdown: str, label: dict[str, Any]) -> dict[str, list[int]]:
    """Per structure ``[right, found, labeled]`` for one document."""
    got = structures(markdown)
    counts: dict[str, list[int]] = {}
    if "title" in label:
        title = got["title"]
        right = int(title is not None and norm(title) == norm(label["title"]))
        counts["title"] = [right, int(title is not None), 1]
    counts["headings"] = [_match(_ranked(got["headings"]), _ranked(label["headings"])),
                          len(got["headings"]), len(label["headings"])]
    items = [norm(_LEADERS.sub("", t)) for t in got["list_items"]]
    labeled = [norm(_LEADERS.sub("", t)) for t in label["list_items"]]
    counts["list_items"] = [_match(items, labeled), len(items), len(labeled)]
    code = [norm(t) for t in got["code"]]
    counts["code"] = [_match(code, [norm(t) for t in label["code"]]), len(code),
                      len(label["code"])]
    counts["tables"] = [_tables_right(got["tables"], label["tables"]), len(got["tables"]),
                        len(label["tables"])]
    return counts


def score(markdowns: list[str], labels: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Precision and recall per structure over a set of documents."""
    totals = {name: [0, 0, 0] for name in STRUCTURES}
    for markdown, label in zip(markdowns, labels, strict=True):
        for name, counts in score_document(markdown, label).items():
            totals[name] = [a + b for a, b in zip(totals[name], counts)]
    return {name: {"right": right, "found": found, "labeled": labeled,
                   "precision": round(right / found, 3) if found else None,
                   "recall": round(right / labeled, 3) if labeled else None}
            for name, (right, found, labeled) in totals.items()}


RUNNER = r"""
import json, sys, time
tool, jobs, repeat = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
out = []
if tool.startswith("rayorch"):
    import re
    from rayorch.pipelines.pdf import AssembleDocument, RenderPdf
    render, assemble = RenderPdf(tables=tool == "rayorch-tables"), AssembleDocument()
    def convert(path, pages):
        [(_, meta)] = render([path])
        [doc] = assemble([[]], [meta])
        md = doc["markdown"]
        if pages is None:
            return md
        parts = re.split(r"(?m)^(?=<!-- page \d+ )", md)
        keep = [p for p in parts[1:] if int(p.split()[2]) in pages]
        return (parts[0] if 1 in pages else "") + "".join(keep)
elif tool.startswith("pymupdf4llm"):
    import pymupdf, pymupdf4llm
    pymupdf.TOOLS.mupdf_display_errors(False)
    if tool == "pymupdf4llm-no-layout":  # its rule-based mode, as without pymupdf_layout
        pymupdf4llm.use_layout(False)
    def convert(path, pages):
        chosen = None if pages is None else [p - 1 for p in pages]
        return pymupdf4llm.to_markdown(path, pages=chosen, show_progress=False)
elif tool == "docling":
    from docling.document_converter import DocumentConverter
    converter = DocumentConverter()
    def convert(path, pages):
        doc = converter.convert(path).document
        return doc.export_to_markdown()
if jobs:  # warm-up, untimed: imports, models and caches load on the first document
    convert(jobs[0]["path"], jobs[0]["pages"])
for job in jobs:  # each job's fastest of `repeat` conversions (the machine may be shared)
    best = None
    for _ in range(repeat):
        t = time.perf_counter()
        md = convert(job["path"], job["pages"])
        best = min(best or 1e9, time.perf_counter() - t)
    out.append({"markdown": md, "seconds": best})
print(json.dumps(out))
"""


def run_tool(tool: str, jobs: list[dict[str, Any]], repeat: int = 1, timeout: float = 3600
             ) -> list[dict[str, Any]]:
    """Convert every job (``{"path", "pages"}``) with one tool, in a subprocess of its own;
    each job's time is the fastest of ``repeat`` conversions."""
    done = subprocess.run([sys.executable, "-c", RUNNER, tool, json.dumps(jobs), str(repeat)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{tool} failed: {tail[0]}")
    return list(json.loads(done.stdout.splitlines()[-1]))


def real_pages(labels_file: Path = LABELS) -> tuple[list[dict[str, Any]], list[str]]:
    """The hand-labeled real pages whose PDF is here, and the ones skipped (not fetched)."""
    found, skipped = [], []
    for entry in json.loads(labels_file.read_text())["documents"]:
        path = (REPO / entry["file"]) if entry["file"].startswith("examples/") else (
            CORPUS / entry["file"])
        if path.exists():
            found.append({"path": str(path), "pages": entry["pages"], "label": entry["label"]})
        else:
            skipped.append(entry["file"])
    return found, skipped


def page_count(path: Path) -> int:
    import pymupdf

    with pymupdf.open(path) as doc:
        return int(doc.page_count)


def measure(tools: tuple[str, ...] = TOOLS, documents: int | None = None, repeat: int = 1
            ) -> dict[str, Any]:
    """Scores and speeds of each tool (a tool that does not import is reported as such)."""
    generated = build_set(SET_DIR, **({"documents": documents} if documents else {}))
    real, skipped = real_pages()
    jobs = [{"path": str(p), "pages": None} for p, _ in generated]
    jobs += [{"path": r["path"], "pages": r["pages"]} for r in real]
    labels = [label for _, label in generated] + [r["label"] for r in real]
    pages = sum(page_count(p) for p, _ in generated)
    report: dict[str, Any] = {"generated_documents": len(generated), "generated_pages": pages,
                              "real_documents": len(real),
                              "real_pages": sum(len(r["pages"]) for r in real),
                              "skipped": skipped, "tools": {}}
    for tool in tools:
        try:
            results = run_tool(tool, jobs, repeat)
        except Exception as exc:  # a tool that does not install or run here: said, not fatal
            report["tools"][tool] = {"error": str(exc)[:500]}
            continue
        markdowns = [r["markdown"] for r in results]
        seconds = sum(r["seconds"] for r in results[:len(generated)])
        report["tools"][tool] = {
            "pages_per_s": round(pages / seconds, 1) if seconds else None,
            "generated": score(markdowns[:len(generated)], labels[:len(generated)]),
            "real": score(markdowns[len(generated):], labels[len(generated):]),
            "all": score(markdowns, labels),
        }
    return report


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(report: dict[str, Any], part: str = "all") -> str:
    """The scores as a Markdown table (P/R per structure, pages/s, speed ratio)."""
    tools = {k: v for k, v in report["tools"].items() if "error" not in v}
    base = tools.get("pymupdf4llm", {}).get("pages_per_s")
    head = "| tool | " + " | ".join(f"{s} P / R" for s in STRUCTURES) + " | pages/s | x p4l |"
    rows = [head, "| --- |" + " ---: |" * (len(STRUCTURES) + 2)]
    for tool, result in tools.items():
        scores = result[part]
        cells = [f"{_cell(scores[s]['precision'])} / {_cell(scores[s]['recall'])}"
                 for s in STRUCTURES]
        speed = result["pages_per_s"]
        ratio = f"{speed / base:.0f}x" if base and speed else "-"
        rows.append(f"| {tool} | " + " | ".join(cells) + f" | {speed} | {ratio} |")
    for tool, result in report["tools"].items():
        if "error" in result:
            rows.append(f"| {tool} | not run: {result['error']} |")
    return "\n".join(rows)


def verdict(report: dict[str, Any], tool: str, base: str = "pymupdf4llm",
            part: str = "all") -> str:
    """Whether ``tool`` scores at least ``base`` on every structure, and how much faster."""
    tools = report["tools"]
    if "error" in tools.get(tool, {"error": 1}) or "error" in tools.get(base, {"error": 1}):
        return f"{tool} vs {base}: not both measured"
    worse = []
    for name in STRUCTURES:
        for metric in ("precision", "recall"):
            ours, theirs = tools[tool][part][name][metric], tools[base][part][name][metric]
            if theirs is not None and (ours is None or ours < theirs):
                worse.append(f"{name} {metric} {ours} < {theirs}")
    speed = tools[tool]["pages_per_s"] / tools[base]["pages_per_s"]
    return (f"{tool} vs {base} ({part}): {speed:.0f}x the pages/s; "
            + ("at least its score on every structure" if not worse else "below on "
               + ", ".join(worse)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated, of {', '.join(TOOLS)}")
    parser.add_argument("--documents", type=int, default=None,
                        help="generated documents (default: the set's size)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="conversions per document; its time is the fastest")
    parser.add_argument("--json", type=Path, default=OUT / "markdown_quality.json")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load_before = round(os.getloadavg()[0], 2)
    report = measure(tuple(args.tools.split(",")), args.documents, args.repeat)
    report["repeat"], report["load_after"] = args.repeat, round(os.getloadavg()[0], 2)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"load average {load_before} before, {report['load_after']} after; "
          f"fastest of {args.repeat} conversions per document")
    print(f"{report['generated_documents']} generated documents ({report['generated_pages']} "
          f"pages), {report['real_documents']} real documents ({report['real_pages']} labeled "
          f"pages); skipped (not fetched): {report['skipped'] or 'none'}")
    for part in ("all", "generated", "real"):
        print(f"\n{part}:\n{table(report, part)}")
    print()
    for tool in ("rayorch-tables", "rayorch"):
        for base in ("pymupdf4llm", "pymupdf4llm-no-layout"):
            print(verdict(report, tool, base))
    print(f"\n{time.perf_counter() - started:.1f} s; JSON in {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
