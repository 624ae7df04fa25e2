"""OCR engines: choice by name, real RapidOCR on rendered pages, the vLLM path without vLLM
(where vLLM can run: test_vllm_runtime; the real engine: tests/model)."""

from __future__ import annotations

import base64
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from rayorch.core.errors import RayorchError
from rayorch.pipelines.document.ocr import (
    DEFAULT_VLM_PROMPT,
    ENGINES,
    OcrBox,
    OcrEngine,
    OcrEngineError,
    Page,
    RapidOcrEngine,
    TextLayerEngine,
    VllmEngine,
    build_vlm_messages,
    engine_needs_image,
    get_engine,
    join_in_reading_order,
    parse_vlm_output,
    png_data_url,
    require_vllm_runtime,
)
from rayorch.pipelines.pdf import OcrPage, RenderPdf
from rayorch.testing import word_recall

pymupdf: Any = pytest.importorskip("pymupdf")  # the [pdf] extra

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"


def squeezed(text: str) -> str:
    """Lower-case letters and digits only: PP-OCR's recognizer often drops word spaces."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def test_unknown_engine_lists_the_valid_ones() -> None:
    with pytest.raises(OcrEngineError, match="unknown OCR engine 'tesseract'") as info:
        get_engine("tesseract")
    assert all(repr(name) in str(info.value) for name in ENGINES)
    assert isinstance(info.value, RayorchError)


def test_bad_engine_option_is_a_clear_error() -> None:
    with pytest.raises(OcrEngineError, match="bad options for OCR engine 'text'"):
        get_engine("text", model="x")


def test_engines_follow_the_protocol_and_declare_image_needs() -> None:
    assert isinstance(get_engine("text"), OcrEngine)
    assert {name: engine_needs_image(name) for name in ENGINES} == {
        "text": False, "rapidocr": True, "vllm": True
    }
    assert TextLayerEngine().recognize([{"page": 1, "text": "abc"}, {"page": 2}]) == ["abc", ""]


def test_reading_order_joins_boxes_into_lines() -> None:
    def box(x: float, y: float, text: str, h: float = 10) -> OcrBox:
        return ([[x, y], [x + 50, y], [x + 50, y + h], [x, y + h]], text, 0.9)

    boxes = [box(200, 52, "right"), box(10, 100, "second"), box(10, 50, "left"),
             box(100, 51, "middle")]
    assert join_in_reading_order(boxes) == "left middle right\nsecond"
    assert join_in_reading_order([]) == ""


def synthetic_page(lines: list[str]) -> Page:
    doc = pymupdf.open()
    page = doc.new_page(width=400, height=200)
    for i, line in enumerate(lines):
        page.insert_text((30, 50 + 40 * i), line, fontsize=16)
    png = page.get_pixmap(dpi=110).tobytes("png")
    return {"page": 1, "width": 400.0, "height": 200.0, "text": page.get_text(), "png": png}


@pytest.fixture(scope="module")
def rapidocr() -> RapidOcrEngine:
    """One engine for the module: building it loads three ONNX models."""
    pytest.importorskip("rapidocr_onnxruntime")
    engine = get_engine("rapidocr")
    assert isinstance(engine, RapidOcrEngine)
    return engine


def test_rapidocr_reads_known_lines_in_order(rapidocr: RapidOcrEngine) -> None:
    page = synthetic_page(["Lineage keeps every page", "Reduce restores order 2024"])
    [text] = rapidocr.recognize([page])
    lines = text.splitlines()
    assert len(lines) == 2
    assert squeezed(lines[0]) == "lineagekeepseverypage"
    assert squeezed(lines[1]) == "reducerestoresorder2024"


def test_rapidocr_matches_the_text_layer_of_a_real_page(rapidocr: RapidOcrEngine) -> None:
    pages, _ = RenderPdf(needs_image=True, dpi=110).render(EXAMPLES / "qtree-qarrows.pdf")
    [text_layer] = OcrPage("text")(pages)
    [ocr] = OcrPage(rapidocr)(pages)
    assert isinstance(text_layer, dict) and isinstance(ocr, dict)
    recall = word_recall(text_layer["text"], ocr["text"])
    assert recall > 0.8, (recall, ocr["text"])


def test_png_data_url_round_trips_and_rejects_non_png() -> None:
    png = synthetic_page(["x"])["png"]
    url = png_data_url(png)
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == png
    with pytest.raises(OcrEngineError, match="not a PNG"):
        png_data_url(b"GIF89a...")


def test_vlm_messages_carry_the_image_then_the_prompt() -> None:
    page = synthetic_page(["hello"])
    [message] = build_vlm_messages(page, "Transcribe.")
    assert message["role"] == "user"
    image, text = message["content"]
    assert image == {"type": "image_url", "image_url": {"url": png_data_url(page["png"])}}
    assert text == {"type": "text", "text": "Transcribe."}
    assert build_vlm_messages(page)[0]["content"][1]["text"] == DEFAULT_VLM_PROMPT


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("```markdown\n# Title\n\nBody\n```", "# Title\n\nBody"),
        ("```\nplain\n```\n", "plain"),
        ("<think>layout first</think>\n# Page<|im_end|>", "# Page"),
        ("  just text  ", "just text"),
        ("text with ``` inside", "text with ``` inside"),
    ],
)
def test_vlm_output_parsing(raw: str, expected: str) -> None:
    assert parse_vlm_output(raw) == expected


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_fails_at_construction_without_vllm() -> None:
    with pytest.raises(OcrEngineError, match="needs vLLM, which is not installed") as info:
        get_engine("vllm", model="Qwen/Qwen2.5-VL-3B-Instruct")
    assert "engine='rapidocr'" in str(info.value)
    assert "pip install 'rayorch[model]'" in str(info.value)  # the CPU build: no GPU needed
    with pytest.raises(OcrEngineError):
        require_vllm_runtime()
    with pytest.raises(OcrEngineError):
        VllmEngine()
