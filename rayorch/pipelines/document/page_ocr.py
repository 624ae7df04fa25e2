"""The PDF job's OCR stage: one OCR engine per actor, batched over pages of many documents.

:class:`OcrPage` runs one batch at a time; :class:`AsyncOcrPage` serves a module with
several batches in flight (``max_inflight``), which share one engine (vLLM). The engines
themselves are :mod:`rayorch.pipelines.document.ocr`; the job wiring is
:mod:`rayorch.pipelines.pdf`.
"""

from __future__ import annotations

from typing import Any

from rayorch import RecordFailure
from rayorch.pipelines.document.ocr import (
    OcrEngine,
    OcrEngineError,
    Page,
    engine_needs_image,
    get_engine,
)
from rayorch.pipelines.document.pdf_markdown import normalise_ligatures

PageText = dict[str, Any]
"""``{"page": n, "text": str, "engine": name}``: one page's recognized text."""


class OcrPage:
    """One OCR engine per actor (chosen by name), batched over pages of many documents.

    ``engine`` is a name for :func:`~rayorch.pipelines.document.ocr.get_engine` (built with
    ``engine_options``) or an already built :class:`~rayorch.pipelines.document.ocr.OcrEngine`.
    Returns per page a :data:`PageText`, or a ``RecordFailure`` for a page the engine
    cannot read (e.g. no image for an engine that needs one). ``lazy`` builds a named
    engine at its first page (``--ocr auto``: most corpora never need it).
    """

    def __init__(self, engine: str | OcrEngine = "text", *, lazy: bool = False,
                 **engine_options: Any) -> None:
        self._engine: OcrEngine | None = None
        self._options = engine_options
        if isinstance(engine, str):
            self.engine_name = engine
            self._needs_image = engine_needs_image(engine)
            if not lazy:
                self._engine = get_engine(engine, **engine_options)
        else:
            self.engine_name = type(engine).__name__
            self._engine = engine
            self._needs_image = bool(engine.needs_image)

    @property
    def engine(self) -> OcrEngine:
        """The engine, built now if it was lazy."""
        if self._engine is None:
            self._engine = get_engine(self.engine_name, **self._options)
        return self._engine

    def __call__(self, pages: list[Page]) -> list[PageText | RecordFailure]:
        results, readable = self._readable(pages)
        texts = self.engine.recognize([pages[i] for i in readable]) if readable else []
        return self._filled(pages, results, readable, texts)

    def _readable(self, pages: list[Page]) -> tuple[list[PageText | RecordFailure], list[int]]:
        """A result slot per page (a RecordFailure for a page the engine cannot read) and
        the positions of the pages to recognize."""
        results: list[PageText | RecordFailure] = []
        readable: list[int] = []
        for i, page in enumerate(pages):
            problem = self._problem(page)
            results.append(RecordFailure(problem) if problem else {})
            if not problem:
                readable.append(i)
        return results, readable

    def _filled(self, pages: list[Page], results: list[PageText | RecordFailure],
                readable: list[int], texts: list[str]) -> list[PageText | RecordFailure]:
        if len(texts) != len(readable):
            raise OcrEngineError(
                f"OCR engine {self.engine_name!r} returned {len(texts)} texts "
                f"for {len(readable)} pages"
            )
        for i, text in zip(readable, texts):
            results[i] = {"page": pages[i]["page"], "text": normalise_ligatures(text),
                          "engine": self.engine_name}
        return results

    def _problem(self, page: Any) -> str | None:
        if not isinstance(page, dict) or "page" not in page:
            return f"bad page: expected a page dict from RenderPdf, got {type(page).__name__}"
        if self._needs_image and not page.get("png"):
            return (
                f"no image: page {page['page']} has no PNG but engine {self.engine_name!r} "
                "reads pixels; render with RenderPdf(needs_image=True)"
            )
        return None


class AsyncOcrPage(OcrPage):
    """:class:`OcrPage` for a module with several batches in flight (``max_inflight``): an
    engine with ``recognize_async`` (vLLM: the batches share one engine) is awaited, any
    other runs in a thread, off the module's event loop."""

    async def __call__(self, pages: list[Page]) -> list[PageText | RecordFailure]:  # type: ignore[override]
        import asyncio

        results, readable = self._readable(pages)
        todo = [pages[i] for i in readable]
        texts: list[str] = []
        if todo:
            engine = self.engine
            recognize_async = getattr(engine, "recognize_async", None)
            texts = (await recognize_async(todo) if recognize_async is not None
                     else await asyncio.to_thread(engine.recognize, todo))
        return self._filled(pages, results, readable, texts)


__all__ = ["AsyncOcrPage", "OcrPage", "PageText"]
