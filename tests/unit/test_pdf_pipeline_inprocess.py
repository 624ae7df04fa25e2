"""PdfPipeline's plan evaluated in process (no Ray): real PDFs, bad ones, several schedules.

The sequential reference interpreter and the kernel-driven executor must give the
same documents as calling the modules directly, and a bad PDF fails only itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayorch.core.outcome import Item, Outcome
from rayorch.core.plan import Policy
from rayorch.core.reference import evaluate
from rayorch.pipelines.pdf import (
    AssembleDocument,
    OcrPage,
    PdfPipeline,
    RenderPdf,
    failure_kind,
    find_pdfs,
)
from rayorch.runtime.in_process import ExecutorOptions, execute

pytest.importorskip("pymupdf")  # the [pdf] extra

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"


def expected_document(path: str) -> dict[str, Any]:
    pages, meta = RenderPdf(ocr_fallback=True).render(path)
    texts = [t for t in OcrPage("rapidocr", lazy=True)(pages) if isinstance(t, dict)]
    [doc] = AssembleDocument()([texts], [meta])
    return doc


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    bad = tmp_path_factory.mktemp("bad") / "notes.pdf"
    bad.write_text("not a PDF at all\n")
    small = [p for p in find_pdfs(EXAMPLES) if "eledpar" not in p and "expex" not in p]
    return [*small[:3], str(bad), *small[3:]]


def check(outputs: dict[int, tuple[Item, ...]], sources: list[str], *, origin: bool) -> None:
    """Good PDFs give their documents; the bad one is suppressed (its cause names the
    render failure when ``origin``: the reference interpreter's causes are terser)."""
    assert sorted(outputs) == list(range(len(sources)))
    for index, path in enumerate(sources):
        [item] = outputs[index]
        if path.endswith("notes.pdf"):
            # render failed; the document's output is suppressed by input propagation
            assert item.outcome is Outcome.SUPPRESSED and item.cause
            if origin:
                assert failure_kind(item.cause) == "not a PDF", item.cause
        else:
            assert item.outcome is Outcome.PRESENT, item
            assert item.value == expected_document(path)


def test_reference_evaluation(sources: list[str]) -> None:
    plan = PdfPipeline().compile()
    check(evaluate(plan, [(p,) for p in sources]).outputs, sources, origin=False)


def test_ocr_with_several_batches_in_flight_gives_the_same_documents(
        sources: list[str]) -> None:
    """``ocr_inflight=2``: the OCR module is AsyncOcrPage (run on its own event loop, the
    CPU engine in a thread); the documents are the same."""
    pipeline = PdfPipeline(ocr_inflight=2)
    assert pipeline.ocr.options.max_inflight == 2
    check(evaluate(pipeline.compile(), [(p,) for p in sources]).outputs, sources, origin=False)


@pytest.mark.parametrize(
    "options",
    [
        ExecutorOptions(batch_size=5, policy=Policy.ELASTIC, actors=2, seed=1, random_order=True),
        ExecutorOptions(batch_size=3, policy=Policy.PARENT_BOUND, seed=2, fault_rate=0.2),
    ],
    ids=["elastic-random-order", "parent-bound-with-faults"],
)
def test_executor_schedules_give_the_same_documents(
    sources: list[str], options: ExecutorOptions
) -> None:
    plan = PdfPipeline().compile()
    check(execute(plan, [(p,) for p in sources], options).outputs, sources, origin=True)
