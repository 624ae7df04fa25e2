"""The PDF pipeline: PDF -> pages -> OCR -> one Markdown document per PDF.

Three batched modules and the pipeline that wires them::

    pages, meta = render(pdfs)           # RenderPdf: per PDF, its ordered pages + metadata
    texts = ocr(F.expand(pages))         # OcrPage: one Grain per page, batched across PDFs
    docs = assemble(F.reduce(texts), meta)   # AssembleDocument: Markdown in page order

Bad input (missing, empty, non-PDF, encrypted, truncated, damaged, zero pages, absurd
page sizes) becomes ``ro.RecordFailure("<kind>: <detail>")`` for that document only.

>>> from rayorch.pipelines.pdf import RenderPdf, OcrPage, AssembleDocument
>>> [(pages, meta)] = RenderPdf()(["examples/pdfs/qtree-qarrows.pdf"])
>>> texts = OcrPage("text")(pages)
>>> [doc] = AssembleDocument()([texts], [meta])
>>> doc["markdown"].count("<!-- page ")
1
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import rayorch as ro
from rayorch import F, FailedResult, RecordFailure
from rayorch.pipelines.ocr import (
    OcrEngine,
    OcrEngineError,
    Page,
    engine_needs_image,
    get_engine,
)

DEFAULT_DPI = 110
MAX_PAGE_SIDE_PT = 14_400.0
"""The PDF implementation limit for a page side (200 inches); larger pages are refused."""
MIN_PAGE_SIDE_PT = 3.0
"""The PDF minimum page side; smaller (or empty) pages are refused."""
DEFAULT_MAX_PAGE_PIXELS = 16_000_000
"""Pixel cap per rendered page: above it the page is rendered at a lower dpi."""

DocumentMeta = dict[str, Any]
"""``{"path": str, "title": str, "page_count": int}``."""
RenderedDocument = tuple[list[Page], DocumentMeta]


def _refuse(kind: str, detail: str) -> RecordFailure:
    """A document-level failure whose cause reads ``"<kind>: <detail>"`` on one line."""
    return RecordFailure(f"{kind}: {' '.join(detail.split())}")


_PROPAGATED = re.compile(r"^[\w.@]+\[[\d.]+\] failed: ")


def failure_kind(cause: str | None) -> str:
    """The stable part of a cause, for counting failures by kind.

    ``"encrypted: x.pdf needs ..."`` -> ``"encrypted"``; a cause propagated by the
    runtime (``"render[3] failed: encrypted: ..."``) counts as its origin's kind.
    """
    if not cause:
        return "unknown"
    while _PROPAGATED.match(cause):
        cause = _PROPAGATED.sub("", cause, count=1)
    return cause.split(":", 1)[0].strip()[:60]


_DAMAGE_WARNINGS = ("syntax error", "format error", "zlib error", "cannot load object",
                    "repairing PDF document")


def _damage_warning(warnings: str) -> str | None:
    """The first MuPDF warning line that means the file is damaged (font quirks are not)."""
    for line in warnings.splitlines():
        if any(marker in line for marker in _DAMAGE_WARNINGS):
            return repr(line.strip()[:120])
    return None


_JUNK_TITLE = re.compile(r"(\.(dvi|tex|pdf|doc|docx)$)|[\\/]|^untitled$", re.IGNORECASE)


def _document_title(doc: Any, path: Path) -> str:
    """The metadata title when it looks like one, else page 1's largest line, else the stem."""
    title = " ".join(str((doc.metadata or {}).get("title") or "").split())
    if title and not _JUNK_TITLE.search(title):
        return title[:200]
    if doc.page_count > 0:
        best_size, best_text = 0.0, ""
        for block in doc[0].get_text("dict").get("blocks", []):
            for line in block.get("lines", []):
                spans = line.get("spans", [])
                text = " ".join("".join(s.get("text", "") for s in spans).split())
                size = max((float(s.get("size", 0.0)) for s in spans), default=0.0)
                if text and size > best_size + 0.5:
                    best_size, best_text = size, text
        if best_text:
            return best_text[:200]
    return path.stem


class RenderPdf:
    """Open each PDF and give its ordered pages (text layer, optional PNG) and metadata.

    Batched: called with a list of paths, returns per path either ``(pages, meta)``
    (a module with ``num_outputs=2``) or a ``RecordFailure`` for that document.
    ``needs_image`` attaches a PNG rendered at ``dpi`` (grayscale by default), lowered
    per page so no page exceeds ``max_page_pixels``. A document that MuPDF had to
    repair, or whose objects or streams it could not parse, is refused unless
    ``allow_damaged`` (MuPDF would silently return partial pages).
    """

    def __init__(
        self,
        *,
        needs_image: bool = False,
        dpi: int = DEFAULT_DPI,
        max_page_pixels: int = DEFAULT_MAX_PAGE_PIXELS,
        max_pages: int | None = None,
        grayscale: bool = True,
        allow_damaged: bool = False,
    ) -> None:
        import pymupdf as pymupdf_module

        # Any: PyMuPDF's own annotations are partial; this class checks its inputs itself.
        pymupdf: Any = pymupdf_module
        if dpi <= 0 or max_page_pixels <= 0:
            raise ro.RayorchError(f"dpi ({dpi}) and max_page_pixels must be positive")
        self._pymupdf = pymupdf
        # MuPDF prints repair warnings on stderr; they are read back per document instead.
        pymupdf.TOOLS.mupdf_display_errors(False)
        self.needs_image = needs_image
        self.dpi = dpi
        self.max_page_pixels = max_page_pixels
        self.max_pages = max_pages
        self.colorspace = pymupdf.csGRAY if grayscale else pymupdf.csRGB
        self.allow_damaged = allow_damaged

    def __call__(self, paths: list[Any]) -> list[RenderedDocument | RecordFailure]:
        results: list[RenderedDocument | RecordFailure] = []
        for path in paths:
            try:
                results.append(self.render(path))
            except RecordFailure as failure:
                results.append(failure)
            except Exception as exc:  # one bad document must never fail the batch
                results.append(_refuse("unreadable", f"{path}: {type(exc).__name__}: {exc}"))
        return results

    def render(self, source: Any) -> RenderedDocument:
        """One document's pages and metadata; raises ``RecordFailure`` for bad input."""
        path = self._check_file(source)
        pymupdf = self._pymupdf
        pymupdf.TOOLS.reset_mupdf_warnings()
        try:
            doc = pymupdf.open(path, filetype="pdf")
        except Exception as exc:
            raise self._damaged(path, f"MuPDF cannot open it ({exc})") from None
        with doc:
            if doc.needs_pass:
                raise _refuse(
                    "encrypted",
                    f"{path} is password-protected; decrypt it first "
                    "(e.g. qpdf --decrypt --password=... in.pdf out.pdf)",
                )
            if doc.is_repaired and not self.allow_damaged:
                raise self._damaged(path, "MuPDF had to repair its cross-reference table")
            if doc.page_count == 0:
                raise _refuse("no pages", f"{path} is a valid PDF with zero pages")
            if self.max_pages is not None and doc.page_count > self.max_pages:
                raise _refuse(
                    "too many pages",
                    f"{path} has {doc.page_count} pages, more than max_pages={self.max_pages}",
                )
            try:
                pages = [self._page(doc, number, path) for number in range(doc.page_count)]
            except RecordFailure:
                raise
            except Exception as exc:
                if doc.is_repaired or _damage_warning(pymupdf.TOOLS.mupdf_warnings()):
                    raise self._damaged(path, f"reading its pages failed ({exc})") from None
                raise
            if not self.allow_damaged:
                damage = _damage_warning(pymupdf.TOOLS.mupdf_warnings())
                if doc.is_repaired or damage:
                    raise self._damaged(path, f"MuPDF reported {damage or 'a repair'} on reading")
            meta = {"path": str(path), "title": _document_title(doc, path),
                    "page_count": doc.page_count}
        return pages, meta

    def _check_file(self, source: Any) -> Path:
        if not isinstance(source, (str, Path)):
            raise _refuse("bad input", f"expected a PDF path (str), got {type(source).__name__}")
        path = Path(source)
        if not path.exists():
            raise _refuse("missing", f"{path} does not exist")
        if not path.is_file():
            raise _refuse("not a file", f"{path} is a directory or special file")
        with path.open("rb") as fh:
            head = fh.read(1024)
        if not head:
            raise _refuse("empty", f"{path} is an empty file (0 bytes)")
        if b"%PDF-" not in head:
            raise _refuse("not a PDF", f"{path} has no %PDF- header in its first 1024 bytes")
        return path

    @staticmethod
    def _damaged(path: Path, why: str) -> RecordFailure:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - 2048))
            tail = fh.read()
        if b"%%EOF" not in tail:
            return _refuse("truncated", f"{path} ends before its %%EOF marker; {why}")
        return _refuse("damaged", f"{path} is corrupt; {why}")

    def _page(self, doc: Any, index: int, path: Path) -> Page:
        page = doc.load_page(index)
        width, height = float(page.rect.width), float(page.rect.height)
        if not (min(width, height) >= MIN_PAGE_SIDE_PT and max(width, height) <= MAX_PAGE_SIDE_PT):
            raise _refuse(
                "page size",
                f"{path} page {index + 1} is {width:g} x {height:g} pt; pages must be "
                f"{MIN_PAGE_SIDE_PT:g} to {MAX_PAGE_SIDE_PT:g} pt a side",
            )
        record: Page = {"page": index + 1, "width": width, "height": height,
                        "text": page.get_text()}
        if self.needs_image:
            zoom = min(self.dpi / 72.0, math.sqrt(self.max_page_pixels / (width * height)))
            # MuPDF rounds the pixel box outwards: shrink until the rounded box fits the cap.
            while math.ceil(width * zoom) * math.ceil(height * zoom) > self.max_page_pixels:
                zoom *= 0.995
            pixmap = page.get_pixmap(
                matrix=self._pymupdf.Matrix(zoom, zoom), colorspace=self.colorspace, alpha=False
            )
            record["png"] = pixmap.tobytes("png")
            record["dpi"] = round(zoom * 72.0, 2)
        return record


PageText = dict[str, Any]
"""``{"page": n, "text": str}``: one page's recognized text."""


class OcrPage:
    """One OCR engine per actor (chosen by name), batched over pages of many documents.

    ``engine`` is a name for :func:`~rayorch.pipelines.ocr.get_engine` (built with
    ``engine_options``) or an already built :class:`~rayorch.pipelines.ocr.OcrEngine`.
    Returns per page a :data:`PageText`, or a ``RecordFailure`` for a page the engine
    cannot read (e.g. no image for an engine that needs one).
    """

    def __init__(self, engine: str | OcrEngine = "text", **engine_options: Any) -> None:
        if isinstance(engine, str):
            self.engine_name = engine
            self.engine = get_engine(engine, **engine_options)
        else:
            self.engine_name = type(engine).__name__
            self.engine = engine

    def __call__(self, pages: list[Page]) -> list[PageText | RecordFailure]:
        results: list[PageText | RecordFailure] = []
        readable: list[int] = []
        for i, page in enumerate(pages):
            problem = self._problem(page)
            results.append(RecordFailure(problem) if problem else {})
            if not problem:
                readable.append(i)
        texts = self.engine.recognize([pages[i] for i in readable]) if readable else []
        if len(texts) != len(readable):
            raise OcrEngineError(
                f"OCR engine {self.engine_name!r} returned {len(texts)} texts "
                f"for {len(readable)} pages"
            )
        for i, text in zip(readable, texts):
            results[i] = {"page": pages[i]["page"], "text": text}
        return results

    def _problem(self, page: Any) -> str | None:
        if not isinstance(page, dict) or "page" not in page:
            return f"bad page: expected a page dict from RenderPdf, got {type(page).__name__}"
        if self.engine.needs_image and not page.get("png"):
            return (
                f"no image: page {page['page']} has no PNG but engine {self.engine_name!r} "
                "reads pixels; render with RenderPdf(needs_image=True)"
            )
        return None


def _clean_text(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def assemble_markdown(page_texts: list[PageText], meta: DocumentMeta) -> str:
    """A Markdown document: the title, then each page's text after ``<!-- page N -->``."""
    parts = [f"# {meta['title']}", f"<!-- source: {meta['path']} -->"]
    for page in page_texts:
        parts.append(f"<!-- page {page['page']} -->")
        text = _clean_text(page["text"])
        if text:
            parts.append(text)
    return "\n\n".join(parts) + "\n"


class AssembleDocument:
    """Ordered page texts plus the document's metadata -> one Markdown document.

    Returns per document ``{"path", "title", "pages", "markdown"}``.
    """

    def __call__(
        self, page_texts: list[list[PageText]], metas: list[DocumentMeta]
    ) -> list[dict[str, Any]]:
        return [
            {
                "path": meta["path"],
                "title": meta["title"],
                "pages": len(texts),
                "markdown": assemble_markdown(texts, meta),
            }
            for texts, meta in zip(page_texts, metas, strict=True)
        ]


class PdfPipeline(ro.Pipeline):
    """PDF -> pages -> OCR -> Markdown, with the OCR engine, replicas and batch size as options.

    ``engine`` is ``"text"`` (PyMuPDF text layer), ``"rapidocr"`` (CPU OCR) or ``"vllm"``
    (a VLM on a GPU; ``engine_options={"model": ...}``). Each result is the
    ``AssembleDocument`` dict of one PDF, or a failed result with its cause.

    >>> plan = PdfPipeline("text").compile()
    """

    def __init__(
        self,
        engine: str = "text",
        *,
        replicas: int = 1,
        batch_size: int = 16,
        dpi: int = DEFAULT_DPI,
        render_replicas: int = 1,
        render_batch_size: int = 2,
        engine_options: dict[str, Any] | None = None,
        ocr_num_cpus: float | None = None,
        ocr_num_gpus: float | None = None,
    ) -> None:
        super().__init__()
        gpu = engine == "vllm"
        self.render = ro.RayModule(
            RenderPdf,
            needs_image=engine_needs_image(engine),
            dpi=dpi,
            num_outputs=2,
            batch_size=render_batch_size,
            replicas=render_replicas,
            num_cpus=1.0,
        )
        # The engine's options are constructor arguments (.pre_init), never execution
        # options: an engine's own timeout_s must not become the batch timeout.
        self.ocr = ro.RayModule(
            OcrPage,
            batch_size=batch_size,
            replicas=replicas,
            num_cpus=ocr_num_cpus if ocr_num_cpus is not None else (1.0 if engine == "rapidocr"
                                                                     else 0.25),
            num_gpus=ocr_num_gpus if ocr_num_gpus is not None else (1.0 if gpu else 0.0),
        ).pre_init(engine, **(engine_options or {}))
        self.assemble = ro.RayModule(AssembleDocument, batch_size=8, num_cpus=0.25)

    def forward(self, pdfs: Any) -> Any:
        pages, meta = self.render(pdfs)
        texts = self.ocr(F.expand(pages))
        return self.assemble(F.reduce(texts), meta)


def find_pdfs(source: str | Path) -> list[str]:
    """The PDF paths under a directory (recursive, sorted), or the file itself."""
    root = Path(source)
    if root.is_dir():
        return [str(p) for p in sorted(root.rglob("*")) if p.suffix.lower() == ".pdf"]
    if root.exists():
        return [str(root)]
    raise ro.RayorchError(f"input {root} does not exist: pass a PDF file or a directory of PDFs")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "document"


def write_outputs(
    results: Iterable[tuple[int, Any]],
    out_dir: str | Path,
    *,
    sources: list[str] | None = None,
    elapsed_s: float | None = None,
) -> dict[str, Any]:
    """Write one ``.md`` per document and ``documents.jsonl``; return a summary dict.

    ``results`` are ``(index, value)`` pairs as a run yields them: ``value`` is an
    ``AssembleDocument`` dict, or a :class:`~rayorch.FailedResult` (or a
    ``RecordFailure``) for a document that did not make it. ``sources`` (the run's
    input paths) name the source of failed documents.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    documents = succeeded = pages = 0
    failures: Counter[str] = Counter()
    with (out / "documents.jsonl").open("w", encoding="utf-8") as jsonl:
        for index, value in results:
            documents += 1
            source = sources[index] if sources is not None and index < len(sources) else None
            row: dict[str, Any] = {"id": index, "source": source, "pages": 0,
                                   "status": "ok", "cause": None, "markdown": None}
            if isinstance(value, dict) and "markdown" in value:
                name = f"{index:05d}-{_slug(Path(value['path']).stem)}.md"
                (out / name).write_text(value["markdown"], encoding="utf-8")
                row.update(source=value["path"], pages=value["pages"], markdown=name)
                succeeded += 1
                pages += int(value["pages"])
            else:
                cause = getattr(value, "cause", None) or f"unexpected result {value!r:.80}"
                status = value.outcome.value if isinstance(value, FailedResult) else "failed"
                row.update(status=status, cause=cause)
                failures[failure_kind(cause)] += 1
            jsonl.write(json.dumps(row, ensure_ascii=False) + "\n")
    summary: dict[str, Any] = {
        "documents": documents,
        "succeeded": succeeded,
        "failed": documents - succeeded,
        "pages": pages,
        "failures": dict(sorted(failures.items())),
        "out_dir": str(out),
    }
    if elapsed_s is not None:
        summary["elapsed_s"] = round(elapsed_s, 3)
        summary["pages_per_s"] = round(pages / elapsed_s, 2) if elapsed_s > 0 else None
    return summary
