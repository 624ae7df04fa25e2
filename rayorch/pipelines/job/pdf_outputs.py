"""What ``rayorch run pdf`` writes: one ``.md`` per document, ``documents.jsonl``, a summary.

The rules for the output directory, the run's file sink, the summary and the exit code
are the job commands' (:mod:`rayorch.pipelines.job.cli`); :data:`PDF_WRITER` fills them
for PDFs: a document's ``.md`` is written just before its record (its ``documents.jsonl``
row) goes to a part file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rayorch.core.words import plural
from rayorch.pipelines.job.cli import summary_dict
from rayorch.pipelines.job.output import JobWriter, OutputDir
from rayorch.pipelines.job.shard_rows import pdf_row, pdf_rows
from rayorch.pipelines.job.summary import JobSummary


def _page_list(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:8])
    return shown + (f" (+{len(numbers) - 8} more)" if len(numbers) > 8 else "")


def document_warnings(source: str, doc: dict[str, Any]) -> list[str]:
    """Summary warnings of one written document: empty pages, garbage text layers.

    Each is true of the mode that ran: a page without a text layer was kept empty only
    when no OCR ran for it (``--ocr text``), so ``--ocr auto`` would OCR it.
    """
    warnings = []
    empty = [int(n) for n in doc.get("empty_pages", ())]
    no_layer = [int(n) for n in doc.get("no_layer_pages", ())]
    after_ocr = [n for n in empty if n not in no_layer]
    if after_ocr:
        warnings.append(f"{source}: {plural(len(after_ocr), 'page')} empty after OCR "
                        f"(page {_page_list(after_ocr)})")
    if no_layer:
        warnings.append(f"{source}: {plural(len(no_layer), 'page')} without a text layer "
                        f"(page {_page_list(no_layer)}); --ocr auto would OCR them")
    garbage = [int(n) for n in doc.get("garbage_pages", ())]
    if garbage:
        warnings.append(f"{source}: garbage text layer kept on page {_page_list(garbage)}; "
                        "--ocr auto would OCR them")
    return warnings


def _finished(value: Any) -> bool:
    return isinstance(value, dict) and "markdown" in value


def _write_document(out: OutputDir, index: int, value: dict[str, Any]) -> dict[str, Any]:
    """A document's files and its row; a region-grain document (``--ocr layout``) also
    writes its figures into ``figures/`` and its content list beside its ``.md``."""
    stem = Path(value["path"]).stem
    row: dict[str, Any] = {}
    if "content_list" in value:
        row["figures"] = [out.write_in_folder(name, png)
                          for name, png in sorted(value["figures"].items())]
        content = json.dumps(value["content_list"], ensure_ascii=False, indent=1) + "\n"
        row["content_list"] = out.write_document(index, stem, ".content_list.json", content)
        row["blocks"] = value["blocks"]
        row["fallbacks"] = value["fallbacks"]
    name = out.write_document(index, stem, ".md", value["markdown"])
    return {"source": value["path"], "sha256": value.get("sha256"), "pages": value["pages"],
            "markdown": name,
            "page_engines": value.get("page_engines"),
            "empty_pages": value.get("empty_pages", []), **row}


def _count_document(summary: JobSummary, value: dict[str, Any]) -> None:
    summary.add_ok(int(value["pages"]))
    summary.engines.update(value.get("page_engines") or ())
    summary.warnings.extend(document_warnings(str(value["path"]), value))


PDF_WRITER = JobWriter(_finished, _write_document, _count_document, pdf_rows, pdf_row)
"""One ``.md`` per document (``NNNNN-<stem>.md``) and its row; with ``--ocr layout`` also
``NNNNN-<stem>.content_list.json`` and the figures under ``figures/``; the summary's pages,
engines and warnings. Results are ``AssembleDocument`` (or ``AssembleRegionDocument``)
dicts, else failed documents."""


def outputs_text(out: OutputDir, summary: JobSummary) -> str:
    """What a PDF run left in ``--output``, for the summary."""
    if out.sharded:
        return (f"{out.url}/documents.jsonl, {out.format} shards (part-*) and _index.parquet "
                "(docs/output-formats.md)")
    files = out.files_written
    what = f"documents.jsonl and {plural(files, '.md file')}" if files else (
        "documents.jsonl (no .md written)")
    return f"{out.url}/{what}"


__all__ = ["PDF_WRITER", "document_warnings", "outputs_text", "summary_dict"]
