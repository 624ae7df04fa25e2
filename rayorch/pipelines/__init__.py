"""Real pipelines built on the public API: :mod:`rayorch.pipelines.pdf` (PDF -> Markdown).

OCR engines for it live in :mod:`rayorch.pipelines.document.ocr`.
"""
