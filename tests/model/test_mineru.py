"""``--ocr mineru`` with a real vLLM engine (vLLM's CPU build) on the kit's tiny random
Qwen2-VL (``python -m rayorch.testmodels DIR --kind mineru``):

* the whole job from the CLI on Ray, its answers held to short valid ones by the test-only
  regexes (random weights write no layout): a ``.md`` and a content list per document from
  the model's boxes, no fallback, the regions in the lineage below their pages, both steps
  served by one module;
* the engine module itself: layout and recognition requests inside one engine at once (its
  own request log says so), and a layout that never validates retried hotter and then
  replaced by the page's text layer, or OCR of the page, with each try's cause recorded.

With random weights the texts are noise: the checks are about where requests and outputs
went, never what they say.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rayorch.cli import main as cli_main

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("mineru_vl_utils")

PDFS = Path(__file__).resolve().parents[2] / "examples" / "pdfs"
MAX_TOKENS = 256
"""Room for the test regexes' answers however the model spells them (two box lines of
special tokens spelled out byte by byte are near 170 tokens)."""


def two_documents(folder: Path) -> list[Path]:
    """A born-digital one-page PDF and a scanned copy of its top third (no text layer)."""
    from rayorch.testing import write_scanned_pdf

    folder.mkdir()
    shutil.copyfile(PDFS / "qtree-qarrows.pdf", folder / "a-qtree.pdf")
    write_scanned_pdf(PDFS / "qtree-qarrows.pdf", folder / "b-scanned.pdf")
    return sorted(folder.iterdir())


def test_run_pdf_with_mineru_writes_each_document_and_its_content_list_from_regions(
    ray_local: None, test_models: dict[str, Path], redis_url: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], audited: Callable[[str, str], bool],
) -> None:
    inputs = two_documents(tmp_path / "pdfs")
    out = tmp_path / "out"
    capsys.readouterr()
    code = cli_main(["run", "pdf", "--input", str(tmp_path / "pdfs"), "--output", str(out),
                     "--ocr", "mineru", "--model", str(test_models["mineru"]),
                     "--max-tokens", str(MAX_TOKENS), "--test-regexes", "--batch-size",
                     "4", "--no-progress", "--json", "--store", redis_url])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    summary = json.loads(captured.out)
    assert summary["page_engines"] == {"mineru": 2} and summary["failed"] == 0
    rows = [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]
    assert [row["source"] for row in rows] == [str(path) for path in inputs]
    entries = 0
    for row in rows:
        assert row["status"] == "ok" and row["page_engines"] == ["mineru"], row
        assert row["fallbacks"] == {}, row  # every answer came from the model, and passed
        markdown = (out / row["markdown"]).read_text()
        assert "<!-- page 1 engine=mineru -->" in markdown
        content = json.loads((out / row["content_list"]).read_text())
        assert 1 <= row["blocks"] <= 2 and len(content) <= row["blocks"]  # <= 2 box lines
        for entry in content:
            assert entry["type"] in {"text", "title", "table", "image", "equation"}
            x0, y0, x1, y1 = entry["bbox"]  # a box of the model's layout, not the whole page
            assert entry["page_idx"] == 0 and x0 < 500 <= x1 < 1000 and y0 < 500 <= y1 < 1000, \
                entry
        entries += len(content)
    assert entries >= 1
    run_id = summary["run_id"]
    capsys.readouterr()
    assert cli_main(["show", run_id, "0", "--store", redis_url]) == 0
    shown = capsys.readouterr().out
    children = [int(n) for n in re.findall(r"expansion \S+: \w+, (\d+) child", shown)]
    assert children[0] == 1 and len(children) == 2 and 1 <= children[1] <= 2, shown
    # one module, two Calls: the page's layout (mineru) and each region's recognition (mineru@1)
    assert re.search(r"\n\s+mineru\[0\.0\]: ", shown) and "mineru@1[0.0.0]: " in shown, shown
    assert audited(run_id, redis_url)


@pytest.fixture(scope="module")
def engine(test_models: dict[str, Path]) -> Iterator[Any]:
    """The engine module in this process, its layout unconstrained (so never valid)."""
    from rayorch.pipelines.document.mineru import MineruEngine

    built = MineruEngine(model=str(test_models["mineru"]), max_tokens=48, max_model_len=1024,
                         kv_cache_memory_bytes=256 << 20, enforce_eager=True)
    yield built
    del built


def page_items(tmp_path: Path) -> list[dict[str, Any]]:
    from rayorch.pipelines.document.region_render import RenderLayoutPages

    found = RenderLayoutPages()([str(path) for path in two_documents(tmp_path / "pdfs")])
    return [page for pages, _numbers, _meta in found for page in pages]


def regions_of(page: dict[str, Any]) -> list[dict[str, Any]]:
    """Three regions of ``page`` as its layout would give them: a title, a table, a formula."""
    from PIL import Image

    from rayorch.pipelines.document.mineru_blocks import layout_regions

    boxes = [("title", (0.05, 0.02, 0.95, 0.1), 0, "title"),
             ("table", (0.05, 0.2, 0.95, 0.6), 0, "table"),
             ("equation", (0.05, 0.6, 0.6, 0.7), 0, "equation")]
    return layout_regions(page, boxes, Image.open(io.BytesIO(page["png"])))


def overlapping(records: list[dict[str, Any]], a: str, b: str) -> bool:
    """Whether a request of step ``a`` and one of step ``b`` were inside the engine together."""
    return any(x["enqueued"] < y["finished"] and y["enqueued"] < x["finished"]
               for x in records if x["step"] == a for y in records if y["step"] == b)


def test_layout_and_recognition_requests_are_inside_one_engine_at_once(
        engine: Any, tmp_path: Path) -> None:
    from rayorch.pipelines.document.region_assemble import block_problem

    pages = page_items(tmp_path)
    regions = regions_of(pages[0])
    before = len(engine.log.records)

    async def both() -> tuple[list[Any], list[Any]]:
        layouts, blocks = await asyncio.gather(engine(pages, step="layout"),
                                               engine(regions, step="recognise"))
        return layouts, blocks

    layouts, blocks = asyncio.run(both())
    records = list(engine.log.records)[before:]
    assert overlapping(records, "layout", "recognise"), records
    assert engine.log.stats()["mixed"] > 0
    assert {r["key"] for r in records} == {"layout", "table", "text", "equation"}
    assert len(layouts) == len(pages) and all(isinstance(found, list) for found in layouts)
    assert [(b["order"], b["kind"]) for b in blocks] == [(0, "title"), (1, "table"),
                                                        (2, "equation")]
    assert all(block_problem(b) is None for b in blocks)


def test_a_layout_that_never_validates_is_retried_hotter_then_falls_back_on_the_record(
        engine: Any, tmp_path: Path) -> None:
    born_digital, scanned = page_items(tmp_path)
    before = len(engine.log.records)
    layouts = asyncio.run(engine([born_digital, scanned], step="layout"))
    records = list(engine.log.records)[before:]
    assert sorted((r["tag"], r["attempt"]) for r in records) == [
        ("layout/1", 1), ("layout/1", 1), ("layout/1", 2), ("layout/1", 2)]
    problem = r"(hit the token limit \(48 tokens\)|unparsable layout: .*|a repetition loop)"
    for [region] in layouts:
        assert region["fallback"] == "ocr-page" and region["bbox"] == [0.0, 0.0, 1.0, 1.0]
        assert re.fullmatch(rf"layout: page 1: try 1 at temperature 0: {problem}; "
                            rf"try 2 at temperature 0\.4: {problem}", region["cause"])
    text_layer, ocr = asyncio.run(engine([region for [region] in layouts], step="recognise"))
    assert text_layer["fallback"] == "text-layer" and "qtree" in text_layer["text"]
    assert ocr["fallback"] == "ocr-page" and ocr["engine"] == "rapidocr" and ocr["text"]
    assert text_layer["cause"] == layouts[0][0]["cause"]
    assert len(engine.log.records) == before + 4  # the fallbacks asked the engine nothing
