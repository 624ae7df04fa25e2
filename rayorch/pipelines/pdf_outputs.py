"""What ``rayorch run pdf`` writes: one ``.md`` per document, ``documents.jsonl``, a summary.

The rules for the output directory, the summary and the exit code are the job
commands' (:mod:`rayorch.pipelines.job_cli`); this module fills them for PDFs.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rayorch.pipelines.job_cli import (
    PDF_JOB,
    JobSummary,
    OutputDir,
    plural,
    summary_dict,
    write_rows,
)


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


def write_outputs(
    results: Iterable[tuple[int, Any]],
    out_dir: str | Path | OutputDir,
    *,
    sources: list[str] | None = None,
    summary: JobSummary | None = None,
) -> JobSummary:
    """Write one ``.md`` per document and a ``documents.jsonl`` row each; count them.

    ``results`` are ``(id, value)`` pairs: ``value`` is an ``AssembleDocument`` dict,
    or a :class:`~rayorch.FailedResult` (or a ``RecordFailure``) for a document that did
    not make it; ``sources`` name the source of failed documents. A plain path is
    (re)made as an output directory whose earlier documents are replaced.
    """
    summary = summary or JobSummary(PDF_JOB, total=len(sources or []))
    return write_rows(results, out_dir, job=PDF_JOB, sources=sources, summary=summary,
                      write_ok=_write_document)


def _write_document(out: OutputDir, summary: JobSummary, index: int, value: Any
                    ) -> dict[str, Any] | None:
    if not (isinstance(value, dict) and "markdown" in value):
        return None
    name = out.write_document(index, Path(value["path"]).stem, ".md", value["markdown"])
    summary.add_ok(int(value["pages"]))
    summary.engines.update(value.get("page_engines") or ())
    summary.warnings.extend(document_warnings(str(value["path"]), value))
    return {"source": value["path"], "pages": value["pages"], "markdown": name,
            "page_engines": value.get("page_engines"),
            "empty_pages": value.get("empty_pages", [])}


def outputs_text(out: OutputDir, summary: JobSummary) -> str:
    """What a PDF run left in ``--output``, for the summary."""
    files = len(out.written) + summary.kept
    what = f"documents.jsonl and {plural(files, '.md file')}" if files else (
        "documents.jsonl (no .md written)")
    return f"{out.path}/{what}"


__all__ = ["document_warnings", "outputs_text", "summary_dict", "write_outputs"]
