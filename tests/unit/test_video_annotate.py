"""Clip annotation engines: stats flags, real OCR on rendered text, the vLLM captioner's CPU side.

The vLLM model call runs in tests/model (vLLM's CPU build, a test model) and tests/gpu; here:
its messages, keyframe limit, output parsing and the clear error without vLLM.
"""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("av")  # the [video] extra

from rayorch.pipelines.video_annotate import (
    ANNOTATORS,
    AnnotatorError,
    StatsAnnotator,
    annotator_needs_image,
    build_caption_messages,
    get_annotator,
    jpeg_data_url,
    limit_keyframes,
    require_vllm_runtime,
)
from rayorch.pipelines.video_decode import read_clip


def _jpeg(text: str = "", size: tuple[int, int] = (320, 120)) -> bytes:
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("RGB", size, "white")
    if text:
        font = ImageFont.load_default(size=36)
        ImageDraw.Draw(image).text((12, 36), text, fill="black", font=font)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def test_stats_flags_follow_the_signals() -> None:
    engine = StatsAnnotator()
    clips = [
        {"signals": {"motion": 3.0, "brightness": 120.0, "sharpness": 500.0}},
        {"signals": {"motion": 0.1, "brightness": 12.0, "sharpness": 4.0}},
        {"signals": {"motion": 2.0, "brightness": 240.0, "sharpness": 500.0}},
    ]
    assert engine.annotate(clips) == [
        {"flags": []}, {"flags": ["dark", "static", "blurry"]}, {"flags": ["bright"]}]


def test_engines_by_name_and_their_errors() -> None:
    assert set(ANNOTATORS) == {"stats", "ocr", "vllm"}
    assert [annotator_needs_image(n) for n in ("stats", "ocr", "vllm")] == [False, True, True]
    with pytest.raises(AnnotatorError, match="unknown annotation engine 'clip'"):
        get_annotator("clip")
    with pytest.raises(AnnotatorError, match="bad options for annotation engine 'stats'"):
        get_annotator("stats", model="x")


def test_ocr_engine_reads_text_drawn_in_a_keyframe() -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    engine = get_annotator("ocr")
    clips = [{"keyframes": [{"t": 0.0, "jpeg": _jpeg("HELLO VIDEO")}]},
             {"keyframes": [{"t": 1.0, "jpeg": _jpeg()}]}]
    texted, blank = engine.annotate(clips)
    assert "HELLO" in texted["texts"][0].upper() and texted["text_coverage"] > 0.02
    assert blank == {"texts": [""], "text_coverage": 0.0}


def test_ocr_engine_on_decoded_keyframes(tmp_path: Path) -> None:
    pytest.importorskip("rapidocr_onnxruntime")
    from rayorch.pipelines.video_synth import write_scenes_video

    path = tmp_path / "plain.mp4"
    write_scenes_video(path, [1.0], fps=10, size=(128, 96))
    clip = {"video": str(path), "start_s": 0.0, "end_s": 1.0, "fps": 10.0}
    decoded = read_clip(clip, positions=[0.0, 1.0], images=True)
    [note] = get_annotator("ocr").annotate([decoded])
    assert len(note["texts"]) == 2 and 0.0 <= note["text_coverage"] <= 1.0


def test_caption_messages_hold_the_keyframes_in_order_then_the_prompt() -> None:
    frames = [{"t": float(i), "jpeg": _jpeg(str(i))} for i in range(5)]
    clip: dict[str, Any] = {"video": "v.mp4", "clip": 0, "keyframes": frames}
    limited = limit_keyframes(clip, 3)
    assert [k["t"] for k in limited["keyframes"]] == [0.0, 2.0, 4.0]
    assert [k["t"] for k in limit_keyframes(clip, 1)["keyframes"]] == [2.0]
    [message] = build_caption_messages(limited, "Describe.")
    assert message["role"] == "user"
    parts = message["content"]
    assert [p["type"] for p in parts] == ["image_url"] * 3 + ["text"]
    assert parts[0]["image_url"]["url"] == jpeg_data_url(frames[0]["jpeg"])
    assert parts[-1]["text"] == "Describe."
    with pytest.raises(AnnotatorError, match="not a JPEG"):
        jpeg_data_url(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(AnnotatorError, match="no keyframes"):
        build_caption_messages({"video": "v.mp4", "clip": 3, "keyframes": []})


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_engine_fails_clearly_without_vllm() -> None:
    with pytest.raises(AnnotatorError, match=r"needs vLLM.*--annotate stats"):
        require_vllm_runtime()
    with pytest.raises(AnnotatorError, match="needs vLLM"):
        get_annotator("vllm", model="any")
