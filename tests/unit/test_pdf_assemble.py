"""OcrPage, AssembleDocument, PDF_WRITER and the PdfPipeline plan, called directly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch.core.plan import NodeKind
from rayorch.pipelines.document.ocr import OcrEngineError, Page
from rayorch.pipelines.document.page_ocr import PageText
from rayorch.pipelines.job.cli import JobSummary, OutputDir
from rayorch.pipelines.pdf import (
    PDF_WRITER,
    AssembleDocument,
    OcrPage,
    PdfPipeline,
    RenderPdf,
    document_warnings,
    find_pdfs,
)
from rayorch.runtime.sinks import read_outputs

pymupdf: Any = pytest.importorskip("pymupdf")  # the [pdf] extra

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"


def present(results: list[PageText | ro.RecordFailure]) -> list[PageText]:
    """The page texts, after checking that no page failed."""
    texts = [r for r in results if not isinstance(r, ro.RecordFailure)]
    assert len(texts) == len(results), results
    return texts


def test_markdown_has_title_markers_engines_and_pages_in_order() -> None:
    meta = {"path": "a.pdf", "title": "A Title", "page_count": 4, "pages": [
        {"page": 1, "engine": None}, {"page": 2, "engine": None},
        {"page": 3, "engine": "text", "layer": "usable", "markdown": "## three"},
        {"page": 4, "engine": "blank", "layer": "empty", "markdown": ""}]}
    texts = [{"page": 2, "text": "  ", "engine": "rapidocr"},
             {"page": 1, "text": "one  \r\nline\n\n\n\nafter", "engine": "rapidocr"}]
    [doc] = AssembleDocument()([texts], [meta])
    assert doc["markdown"] == (
        "# A Title\n\n<!-- source: a.pdf -->\n\n<!-- page 1 engine=rapidocr -->\n\n"
        "one\nline\n\nafter\n\n<!-- page 2 engine=rapidocr -->\n\n"
        "<!-- page 3 engine=text -->\n\n## three\n\n<!-- page 4 engine=blank -->\n"
    )
    assert doc["page_engines"] == ["rapidocr", "rapidocr", "text", "blank"]
    assert doc["empty_pages"] == [2]  # the blank page has no ink: not a warning
    assert document_warnings("a.pdf", doc) == ["a.pdf: 1 page empty after OCR (page 2)"]


def test_text_engine_round_trip_over_a_batch_of_mixed_documents() -> None:
    paths = [str(EXAMPLES / "gb4e-doc.pdf"), str(EXAMPLES / "phonrule-doc.pdf")]
    rendered = [RenderPdf(needs_image=True, dpi=10).render(path) for path in paths]
    # One OCR batch mixing the pages of both documents, as an elastic scheduler would.
    texts = present(OcrPage("text")([page for pages, _ in rendered for page in pages]))
    split = len(rendered[0][0])
    docs = AssembleDocument()([texts[:split], texts[split:]], [meta for _, meta in rendered])
    for path, doc in zip(paths, docs):
        with pymupdf.open(path) as pdf:
            assert doc["pages"] == pdf.page_count
            markers = [f"<!-- page {n} engine=text -->" for n in range(1, pdf.page_count + 1)]
            positions = [doc["markdown"].index(m) for m in markers]
            assert positions == sorted(positions)
            last_page_words = pdf[-1].get_text().split()[:5]
        tail = doc["markdown"][positions[-1]:]
        assert all(word in tail for word in last_page_words)


def test_ocr_page_fails_only_pages_without_the_image_it_needs() -> None:
    class ImageEngine:
        needs_image = True

        def recognize(self, pages: list[Page]) -> list[str]:
            return [f"read {len(p['png'])} bytes" for p in pages]

    ocr = OcrPage(ImageEngine())
    junk: Any = "junk"
    results = ocr([{"page": 1, "png": b"12"}, {"page": 2, "text": "no image"}, junk])
    assert results[0] == {"page": 1, "text": "read 2 bytes", "engine": "ImageEngine"}
    assert isinstance(results[1], ro.RecordFailure) and results[1].cause.startswith("no image:")
    assert isinstance(results[2], ro.RecordFailure) and results[2].cause.startswith("bad page:")


def test_ocr_page_rejects_an_engine_that_loses_pages() -> None:
    class LossyEngine:
        needs_image = False

        def recognize(self, pages: list[Page]) -> list[str]:
            return []

    ocr = OcrPage(LossyEngine())
    with pytest.raises(OcrEngineError, match="engine 'LossyEngine' returned 0 texts for 1 pages"):
        ocr([{"page": 1, "text": "x"}])


def test_pdf_writer_files_rows_records_and_summary(tmp_path: Path) -> None:
    good = str(EXAMPLES / "phonrule-doc.pdf")
    sources = [good, "/nowhere/missing.pdf", "/x/locked.pdf"]
    pages, meta = RenderPdf(ocr_fallback=True).render(good)
    [doc] = AssembleDocument()([present(OcrPage("text")(pages))], [meta])
    results = [
        (0, doc),
        (1, ro.FailedResult(1, ro.Outcome.FAILED, "missing: /nowhere/missing.pdf does not exist")),
        (2, ro.FailedResult(2, ro.Outcome.SUPPRESSED,
                            "render[2] failed: encrypted: /x/locked.pdf needs a password")),
    ]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "00007-stale.md").write_text("from an earlier run")
    (tmp_path / "out" / "documents.jsonl").write_text("")
    out = OutputDir.prepare(tmp_path / "out", job="pdf", sources=sources, options={},
                            overwrite=True)
    sink = out.sink_for("run-1", PDF_WRITER)  # what the driver delivers to
    out.note_run("run-1")
    summary = JobSummary("pdf", total=len(sources))
    for index, value in results:
        sink.write_part(0, [(index, value)])
        PDF_WRITER.delivered(summary, sources[index], value)
    out.finish(complete=True)

    assert (summary.done, summary.succeeded, summary.failed, summary.parts) == (3, 1, 2, 4)
    assert summary.failure_kinds() == {"encrypted": 1, "missing": 1}
    rows = [json.loads(line) for line in (tmp_path / "out" / "documents.jsonl").read_text()
            .splitlines()]
    # One word for a document that did not make it, in the rows and in the summary.
    assert [(r["id"], r["source"], r["pages"], r["status"]) for r in rows] == [
        (0, good, 4, "ok"), (1, sources[1], 0, "failed"), (2, sources[2], 0, "failed")
    ]
    assert summary.failures == [(r["source"], r["cause"]) for r in rows[1:]]
    assert rows[0]["page_engines"] == ["text"] * 4 and rows[0]["cause"] is None
    assert (tmp_path / "out" / rows[0]["markdown"]).read_text() == doc["markdown"]
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names[:4] == [".rayorch-output.json", "00000-phonrule-doc.md", "_rayorch_sink.json",
                         "documents.jsonl"]
    assert len(names) == 7 and all(n.startswith("part-s00000-") for n in names[4:])
    records = sorted(read_outputs(tmp_path / "out"), key=lambda r: r["index"])
    assert records[0]["value"] == rows[0]  # the record is the row
    assert [r["outcome"] for r in records] == ["present", "failed", "suppressed"]


def test_pdf_pipeline_compiles_render_expand_ocr_reduce_assemble() -> None:
    plan = PdfPipeline("rapidocr", replicas=3, batch_size=12).compile()
    kinds = [n.kind for n in plan.nodes]
    assert kinds == [NodeKind.INPUT, NodeKind.CALL, NodeKind.EXPAND, NodeKind.FILTER,
                     NodeKind.CALL, NodeKind.REDUCE, NodeKind.CALL, NodeKind.OUTPUT]
    assert [c.call.id for c in plan.calls if c.call] == ["render", "ocr", "assemble"]
    assert plan.call_node("ocr").domain == "root/0"
    ocr = plan.options("ocr")
    assert (ocr.replicas, ocr.batch_size, ocr.num_gpus) == (3, 12, 0.0)
    render = plan.module("render")
    assert dict(render.kwargs)["needs_image"] is True
    assert render.options.num_outputs == 3  # every page, which to OCR, metadata
    assert dict(plan.module("ocr").kwargs) == {} and plan.module("ocr").args == ("rapidocr",)


def test_pdf_pipeline_gpu_engine_asks_for_a_gpu_and_text_engine_for_no_images(
        vllm_build: Any) -> None:
    vllm_build("vllm")  # vLLM's GPU build (its CPU build asks for none: test_vllm_runtime)
    vlm = PdfPipeline("vllm", engine_options={"model": "some/vlm"}).compile()
    assert vlm.options("ocr").num_gpus == 1.0
    assert dict(vlm.module("ocr").kwargs) == {"model": "some/vlm"}
    text = PdfPipeline("text").compile()
    assert dict(text.module("render").kwargs)["needs_image"] is False
    auto = PdfPipeline().compile()  # the default: text layer, rapidocr where it is missing
    assert dict(auto.module("render").kwargs)["ocr_fallback"] is True
    assert auto.module("ocr").args == ("rapidocr",)
    assert dict(auto.module("ocr").kwargs) == {  # its pool sizes itself: ONNX on its CPUs
        "lazy": True, "intra_op_num_threads": 1, "inter_op_num_threads": 1}


def test_pdf_pipeline_rejects_an_unknown_engine_before_running() -> None:
    with pytest.raises(ro.RayorchError, match="unknown OCR engine 'tesseract'"):
        PdfPipeline("tesseract")


def test_samples_directory_is_the_readme_input() -> None:
    assert len(find_pdfs(EXAMPLES)) == 8
