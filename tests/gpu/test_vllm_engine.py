"""The vLLM OCR engine on a real GPU (marked ``gpu``: excluded from the default suite).

Runs only where vLLM imports, a CUDA device is visible and ``RAYORCH_VLLM_MODEL`` names a model
available offline (a local directory or a cached hub id). The CPU side of the engine (prompt,
image encoding, output parsing, clear errors) is tested in ``tests/unit/test_ocr_engines.py``.

    RAYORCH_VLLM_MODEL=/models/Qwen2.5-VL-3B-Instruct pytest -m gpu tests/gpu
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"


def _model_or_skip() -> str:
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")
    model = os.environ.get("RAYORCH_VLLM_MODEL")
    if not model:
        pytest.skip("set RAYORCH_VLLM_MODEL to a model available offline")
    return model


def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]{4,}", text)}


def test_vllm_engine_transcribes_rendered_pages_in_order() -> None:
    model = _model_or_skip()
    from rayorch.pipelines.document.ocr import get_engine
    from rayorch.pipelines.pdf import RenderPdf

    render = RenderPdf(needs_image=True, dpi=110)
    [rendered] = render([str(SAMPLES / "verse.pdf")])
    pages = rendered[0][:3]  # RenderPdf gives (pages, metadata) per document
    engine = get_engine("vllm", model=model, max_tokens=1024, max_model_len=8192)
    texts = engine.recognize(pages)
    assert len(texts) == len(pages)
    for page, text in zip(pages, texts):
        expected = _words(page["text"])
        if not expected:
            continue
        found = len(expected & _words(text)) / len(expected)
        assert found > 0.6, (page["page"], found, text[:200])
