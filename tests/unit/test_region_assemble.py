"""The region grain's pure parts, on hand-made blocks: page and document assembly, the
content list, the fallback budget, and the job output of figures and content lists.

The models themselves (layout, recognition) are tested with their modules; here every
block is written out so each Markdown and content-list rule is visible in the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch.pipelines.document.region_assemble import (
    AssemblePage,
    AssembleRegionDocument,
    assemble_page,
)
from rayorch.pipelines.document.regions import KeepRegions
from rayorch.pipelines.job.output import OutputDir
from rayorch.pipelines.job.pdf_outputs import PDF_WRITER
from rayorch.runtime.sinks import read_outputs

STEM = "paper-0a1b2c3d"
META = {"path": "in/paper.pdf", "title": "paper", "page_count": 2, "figure_stem": STEM}
PNG = b"\x89PNG\r\n\x1a\nfigure bytes"


def block(order: int, kind: str, page: int = 1, fallback: str | None = None,
          **content: Any) -> dict[str, Any]:
    return {"page": page, "order": order, "kind": kind, "bbox": [0.1, 0.1 * order, 0.9, 0.2],
            "engine": "text-layer", "fallback": fallback, **content}


PAGE_1 = [  # out of order on purpose: the page is put in reading order by "order"
    block(2, "table", table={"markdown": "| a | b |\n| --- | --- |\n| 1 | 2 |"}),
    block(0, "title", text="Results  and\nmethods"),
    block(1, "text", text="We measured."),
    block(3, "figure", image=PNG),
    block(4, "figure_caption", text="Figure 1: a plot."),
    block(5, "equation", latex="E = mc^2"),
    block(6, "title", text="Discussion"),
    block(7, "table", table={"html": "<table><tr><td colspan=2>x</td></tr></table>"}),
    block(8, "equation", image=PNG),
    block(9, "text", text="   "),
]


def test_a_page_in_reading_order_with_headings_tables_figures_and_equations() -> None:
    page = assemble_page(PAGE_1, 1, STEM)
    assert page["markdown"].split("\n\n") == [
        "# Results and methods",            # page 1's first title: the document's heading
        "We measured.",
        "| a | b |\n| --- | --- |\n| 1 | 2 |",
        f"![](figures/{STEM}-p1-3.png)",
        "Figure 1: a plot.",
        "$$\nE = mc^2\n$$",
        "## Discussion",
        "<table><tr><td colspan=2>x</td></tr></table>",
        f"![](figures/{STEM}-p1-8.png)",     # an equation without LaTeX: its image
    ]
    assert page["figures"] == {f"figures/{STEM}-p1-3.png": PNG,
                               f"figures/{STEM}-p1-8.png": PNG}
    assert page["titled"] and page["blocks"] == 10 and page["fallbacks"] == {}


def test_the_content_list_has_minerus_shape_in_reading_order() -> None:
    content = assemble_page(PAGE_1, 2, STEM)["content"]
    assert [(e["type"], e.get("text_level")) for e in content] == [
        ("title", 1), ("text", None), ("table", None), ("image", None), ("text", None),
        ("equation", None), ("title", 1), ("table", None), ("equation", None)]
    title, _, table, image, _, latex, _, html, equation = content
    assert title["text"] == "Results and methods"
    assert table["table_body"].startswith("| a | b |") and html["table_body"].startswith("<t")
    assert image["img_path"] == f"figures/{STEM}-p2-3.png"
    assert latex["latex"] == "E = mc^2" and equation["img_path"] == f"figures/{STEM}-p2-8.png"
    assert all(e["page_idx"] == 1 for e in content)
    assert table["bbox"] == [100, 200, 900, 200]  # a 0..1 box on the 0..1000 grid


def boxed(order: int, kind: str, bbox: list[float], **content: Any) -> dict[str, Any]:
    return {**block(order, kind, **content), "bbox": bbox}


TWO_COLUMNS = [  # the layout's reading order runs down the left column, then the right one;
    # top-to-bottom, left-to-right would interleave the columns (1, 3, 2, 4)
    boxed(4, "text", [0.52, 0.55, 0.95, 0.90], text="Right, lower."),
    boxed(2, "text", [0.05, 0.60, 0.48, 0.90], text="Left, lower."),
    boxed(0, "title", [0.10, 0.02, 0.90, 0.08], text="Two columns"),
    boxed(3, "table", [0.52, 0.10, 0.95, 0.50], table={"markdown": "| r |\n| --- |\n| 1 |"}),
    boxed(1, "text", [0.05, 0.12, 0.48, 0.55], text="Left, upper."),
]


def test_a_two_column_page_is_read_in_its_reading_order_not_top_to_bottom() -> None:
    page = assemble_page(TWO_COLUMNS, 1, STEM)
    assert page["markdown"].split("\n\n") == [
        "# Two columns", "Left, upper.", "Left, lower.", "| r |\n| --- |\n| 1 |",
        "Right, lower."]
    content = page["content"]
    assert [e.get("text") or e.get("table_body") for e in content] == [
        "Two columns", "Left, upper.", "Left, lower.", "| r |\n| --- |\n| 1 |",
        "Right, lower."]
    assert [e["bbox"][0] for e in content] == [100, 50, 50, 520, 520]


def test_a_title_is_the_documents_heading_only_when_it_opens_page_1() -> None:
    later = assemble_page([block(0, "title", text="Appendix")], 2, STEM)
    assert later["markdown"] == "## Appendix" and not later["titled"]
    [document] = AssembleRegionDocument()([[assemble_page(PAGE_1, 1, STEM), later]], [META])
    assert document["markdown"].startswith("<!-- source: in/paper.pdf -->\n\n"
                                           "<!-- page 1 engine=layout -->\n\n# Results")
    untitled = assemble_page([block(0, "text", text="Body.")], 1, STEM)
    [document] = AssembleRegionDocument(page_markers=False)([[untitled]], [META])
    assert document["markdown"] == "# paper\n\n<!-- source: in/paper.pdf -->\n\nBody.\n"


def test_a_document_joins_its_pages_content_and_figures() -> None:
    pages = AssemblePage()([PAGE_1, []], [1, 2], [META, META])
    [document] = AssembleRegionDocument()([pages], [META])
    assert document["pages"] == 2 and document["blocks"] == 10
    assert [e["page_idx"] for e in document["content_list"]] == [0] * 9
    assert sorted(document["figures"]) == [f"figures/{STEM}-p1-3.png",
                                           f"figures/{STEM}-p1-8.png"]
    assert document["empty_pages"] == [2] and document["page_engines"] == ["layout"] * 2


def test_a_malformed_block_fails_its_page_with_the_cause() -> None:
    [failure] = AssemblePage()([[{"page": 1, "order": 0, "kind": "text", "bbox": [0] * 4,
                                  "text": "a", "latex": "b"}]], [1], [META])
    assert isinstance(failure, ro.RecordFailure)
    assert "assemble page 1" in failure.cause and "one content field" in failure.cause


def test_the_fallback_budget_fails_a_document_past_its_share_with_the_causes() -> None:
    blocks = [block(0, "text", text="fine"),
              block(1, "text", fallback="ocr-crop", text="x", cause="recognise: broken crop"),
              block(2, "text", fallback="ocr-page", text="y", cause="layout: no image")]
    pages = [assemble_page(blocks, 1, STEM)]
    assert pages[0]["fallbacks"] == {"ocr-crop": 1, "ocr-page": 1}
    [kept] = AssembleRegionDocument()([pages], [META])  # 1.0: off
    assert kept["fallbacks"] == {"ocr-crop": 1, "ocr-page": 1}
    [at_budget] = AssembleRegionDocument(max_fallback_share=2 / 3)([pages], [META])
    assert isinstance(at_budget, dict)
    [failed] = AssembleRegionDocument(max_fallback_share=0.5)([pages], [META])
    assert isinstance(failed, ro.RecordFailure)
    assert failed.cause.startswith("in/paper.pdf: fallback budget: 2 of 3 blocks fell back")
    assert "1 ocr-crop, 1 ocr-page" in failed.cause and "0.67 > --max-fallback-share 0.5" \
        in failed.cause
    assert "page 1 region 1: recognise: broken crop" in failed.cause
    with pytest.raises(ro.RayorchError, match="share from 0 to 1"):
        AssembleRegionDocument(max_fallback_share=1.5)


def test_running_page_furniture_is_not_recognised() -> None:
    regions = [{"kind": k} for k in ("header", "title", "text", "footer", "page_number")]
    assert KeepRegions()([regions, []]) == [(regions, [False, True, True, False, False]),
                                             ([], [])]


def region_document(index: int) -> dict[str, Any]:
    page = assemble_page(PAGE_1, 1, f"doc{index}-0a1b2c3d")
    [document] = AssembleRegionDocument()([[page]], [{**META, "path": f"in/doc{index}.pdf"}])
    return document


def deliver(out_dir: Path, sources: list[str], indexes: list[int], **prepare: Any) -> None:
    out = OutputDir.prepare(out_dir, job="pdf", sources=sources, options={"ocr": "layout"},
                            **prepare)
    sink = out.sink_for(f"run-{len(out.marker['runs']) + 1}", PDF_WRITER)
    out.note_run(f"run-{len(out.marker['runs']) + 1}")
    for index in indexes:
        sink.write_part(0, [(index, region_document(index))])
    out.finish(complete=True)


def test_figures_and_the_content_list_are_written_beside_the_md_and_recorded(
        tmp_path: Path) -> None:
    sources = ["in/doc0.pdf", "in/doc1.pdf"]
    deliver(tmp_path, sources, [0, 1])
    [row0, row1] = [json.loads(line) for line in
                    (tmp_path / "documents.jsonl").read_text().splitlines()]
    assert row0["markdown"] == "00000-doc0.md"
    assert row0["content_list"] == "00000-doc0.content_list.json"
    assert row0["figures"] == ["figures/doc0-0a1b2c3d-p1-3.png", "figures/doc0-0a1b2c3d-p1-8.png"]
    for name in [row0["markdown"], row0["content_list"], *row0["figures"], *row1["figures"]]:
        assert (tmp_path / name).is_file(), name
    assert (tmp_path / row0["figures"][0]).read_bytes() == PNG
    assert "![](figures/doc0-0a1b2c3d-p1-3.png)" in (tmp_path / row0["markdown"]).read_text()
    content = json.loads((tmp_path / row0["content_list"]).read_text())
    assert [e["type"] for e in content][:4] == ["title", "text", "table", "image"]
    assert [r["value"]["figures"] for r in read_outputs(tmp_path)] == [row0["figures"],
                                                                       row1["figures"]]

    (tmp_path / row1["figures"][1]).unlink()  # lost since: document 1 runs again
    out = OutputDir.prepare(tmp_path, job="pdf", sources=sources, options={"ocr": "layout"},
                            resume=True)
    assert sorted(out.kept) == [0]
    assert not (tmp_path / row1["figures"][0]).exists()  # its stale files went too
    assert all((tmp_path / name).is_file() for name in [row0["content_list"], *row0["figures"]])
    out.finish(complete=True)

    deliver(tmp_path, sources[:1], [], overwrite=True)  # nothing of the earlier run stays
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rayorch-output.json",
                                                          "_rayorch_sink.json",
                                                          "documents.jsonl"]


class RecogniserFailingOddRegions:
    """A recogniser following RecogniseRegion's protocol that cannot read odd regions."""

    def __init__(self, engine: str = "text-layer") -> None:
        self.engine = engine

    def __call__(self, regions: list[dict[str, Any]]) -> list[Any]:
        return [ro.RecordFailure(f"recognise: region {r['order']}: unreadable") if r["order"] % 2
                else {**block(r["order"], r["kind"], text="read"), "engine": self.engine}
                for r in regions]


class LayoutFailingPage2:
    """A layout model following DetectLayout's protocol that cannot read page 2, and raises
    for a batch holding page 3."""

    def __call__(self, pages: list[dict[str, Any]]) -> list[Any]:
        if any(p["page"] == 3 for p in pages):
            raise MemoryError("page 3 is too large")
        return [ro.RecordFailure("layout: page 2: no regions") if p["page"] == 2
                else [{"page": p["page"], "order": 0, "kind": "text", "bbox": [0, 0, 1, 1],
                       "score": 0.9, "crop": p["png"], "words": []}] for p in pages]


def text_png(text: str) -> bytes:
    pymupdf: Any = pytest.importorskip("pymupdf")
    doc = pymupdf.open()
    page = doc.new_page(width=300, height=60)
    page.insert_text((10, 40), text, fontsize=24)
    return bytes(page.get_pixmap(dpi=144).tobytes("png"))


@pytest.mark.layout  # a real RapidOCR: seconds on a busy CPU, so in the layout suite
def test_a_region_that_fails_falls_back_to_ocr_of_its_crop_and_its_siblings_stay() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from rayorch.pipelines.document.regions import RecogniseOrFallback

    regions = [{"page": 1, "order": i, "kind": "text", "bbox": [0.1, 0.1, 0.9, 0.2],
                "crop": crop, "words": []}
               for i, crop in enumerate([b"", text_png("Fallback words"), b"", b"not a png"])]
    first, second, third, fourth = RecogniseOrFallback(RecogniserFailingOddRegions)(regions)
    assert first["text"] == third["text"] == "read" and first["fallback"] is None
    assert second["fallback"] == "ocr-crop" and second["engine"] == "rapidocr"
    assert "Fallback" in second["text"] and second["cause"] == "recognise: region 1: unreadable"
    assert fourth["fallback"] == "ocr-crop" and fourth["text"] == ""  # nothing to read: empty
    assert fourth["cause"].startswith("recognise: region 3: unreadable; OCR of the crop: ")


def test_a_page_layout_cannot_read_becomes_one_region_marked_as_its_fallback() -> None:
    from rayorch.pipelines.document.regions import LayoutOrFallback, RecogniseOrFallback

    pages = [{"page": n, "png": b"png", "words": [[1, 2, 3, 4, "w"]], "width_pt": 612.0,
              "height_pt": 792.0} for n in (1, 2, 3)]
    ok, whole, raised = LayoutOrFallback(LayoutFailingPage2)(pages)
    assert ok[0]["score"] == 0.9 and "fallback" not in ok[0]  # its batch-mate raised
    assert raised[0]["cause"] == "layout: MemoryError: page 3 is too large"
    [region] = whole
    assert (region["kind"], region["bbox"], region["crop"]) == ("text", [0.0, 0.0, 1.0, 1.0],
                                                                b"png")
    assert region["fallback"] == "ocr-page" and region["cause"] == "layout: page 2: no regions"
    [from_layer] = RecogniseOrFallback(RecogniserFailingOddRegions)([region])
    assert (from_layer["fallback"], from_layer["cause"]) == ("text-layer", region["cause"])
    [from_ocr] = RecogniseOrFallback(RecogniserFailingOddRegions, engine="rapidocr")([region])
    assert from_ocr["fallback"] == "ocr-page"


def test_the_layout_engine_compiles_document_page_region_and_one_module_may_serve_both(
        ) -> None:
    from rayorch.core.plan import NodeKind
    from rayorch.pipelines.pdf import PdfPipeline

    pipeline = PdfPipeline("layout", batch_size=24, replicas=2, layout_batch_size=3)
    plan = pipeline.compile()
    assert [c.call.id for c in plan.calls if c.call] == [
        "render", "layout", "keep", "recognise", "assemble_page", "assemble"]
    domains = {call: plan.call_node(call).domain for call in ("render", "layout", "recognise",
                                                               "assemble_page", "assemble")}
    assert domains == {"render": "root", "layout": "root/0", "recognise": "root/0/0",
                       "assemble_page": "root/0", "assemble": "root"}
    kinds = [n.kind for n in plan.nodes]
    assert kinds.count(NodeKind.EXPAND) == 2 and kinds.count(NodeKind.REDUCE) == 2
    assert NodeKind.FILTER in kinds and NodeKind.BROADCAST in kinds  # furniture; the meta
    recognise, layout = plan.options("recognise"), plan.options("layout")
    assert (recognise.batch_size, recognise.replicas, layout.batch_size) == (24, 2, 3)
    assert dict(plan.module("render").kwargs)["dpi"] == 144
    default = PdfPipeline("layout").compile()  # runs through the API on two cores
    assert sum(m.options.replicas * m.options.num_cpus for m in default.modules) <= 2.0

    class OneModelForBoth(PdfPipeline):
        """A model that serves layout and recognition: one module, called at two places."""

        def forward(self, pdfs: Any) -> Any:
            return self.regions(pdfs, self.layout, self.layout)

    shared = OneModelForBoth("layout").compile()
    calls = [c.call for c in shared.calls if c.call]
    assert [c.module for c in calls].count("layout") == 2  # two Calls, one pool
    assert "recognise" not in [c.module for c in calls]


def test_the_cli_refuses_a_fallback_share_outside_0_to_1_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rayorch.cli import main as cli_main
    from rayorch.pipelines.job.summary import EXIT_USAGE

    source = Path(__file__).resolve().parents[2] / "examples" / "pdfs" / "qtree-qarrows.pdf"
    argv = ["run", "pdf", "--input", str(source), "--output",
            str(tmp_path / "out"), "--ocr", "layout", "--max-fallback-share", "1.5"]
    try:
        code = cli_main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    assert code == EXIT_USAGE
    assert "--max-fallback-share is a share from 0 to 1, not 1.5" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


class TableModelRefusing:
    """A table model following SlanetTableModel's protocol whose structure never fits its
    cells (two cells, one box): recognition must refuse it and read the table as text."""

    def structure(self, image: Any) -> tuple[list[str], list[tuple[float, ...]]]:
        return ["<tr>", "<td></td>", "<td></td>", "</tr>"], [(0.0, 0.0, 10.0, 10.0)]


def test_a_refused_table_structure_is_a_recorded_fallback_counted_by_the_budget() -> None:
    pytest.importorskip("PIL")
    from rayorch.pipelines.document.recognise import RecogniseRegion

    recognise = RecogniseRegion.__new__(RecogniseRegion)  # no model load: text-layer words
    recognise.tables = TableModelRefusing()
    words = [[10, 10, 60, 24, "Quarterly"], [64, 10, 120, 24, "revenue"],
             [10, 30, 60, 44, "rose"], [64, 30, 120, 44, "sharply"]]
    region = {"page": 1, "order": 1, "kind": "table", "bbox": [0.0, 0.0, 0.5, 0.2],
              "crop": text_png("Quarterly revenue rose sharply"), "words": words,
              "width_pt": 300, "height_pt": 300}
    [table] = recognise([region])
    assert table["fallback"] == "text-layer" and table["engine"] == "text-layer"
    assert "table" not in table and "Quarterly revenue" in table["text"]
    page = assemble_page([block(0, "text", text="Intro."), table], 1, STEM)
    assert page["fallbacks"] == {"text-layer": 1}
    entry = page["content"][1]
    assert entry["type"] == "text" and entry["fallback"] == "text-layer"
    assert entry["region_kind"] == "table"
    assert "fallback" not in page["content"][0]
    [failure] = AssembleRegionDocument(max_fallback_share=0.4)([[page]], [META])
    assert isinstance(failure, ro.RecordFailure)
    assert "1 of 2 blocks fell back (1 text-layer)" in failure.cause
    [document] = AssembleRegionDocument(max_fallback_share=0.5)([[page]], [META])
    assert document["fallbacks"] == {"text-layer": 1}
