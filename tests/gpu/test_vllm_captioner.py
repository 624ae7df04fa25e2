"""The vLLM clip captioner on a real GPU (marked ``gpu``: excluded from the default suite).

Runs only where vLLM imports, a CUDA device is visible and ``RAYORCH_VLLM_MODEL`` names a
vision-language model available offline. Its CPU side (messages, keyframe limit, errors)
is tested in ``tests/unit/test_video_annotate.py``.

    RAYORCH_VLLM_MODEL=/models/Qwen2.5-VL-3B-Instruct pytest -m gpu tests/gpu
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "videos" / "scenes.mp4"


def test_vllm_captioner_gives_one_caption_per_clip_in_one_batch() -> None:
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible")
    model = os.environ.get("RAYORCH_VLLM_MODEL")
    if not model:
        pytest.skip("set RAYORCH_VLLM_MODEL to a model available offline")
    from rayorch.pipelines.video import DecodeClip, ProbeVideo
    from rayorch.pipelines.video_annotate import get_annotator

    clips, _meta = ProbeVideo().probe(str(SAMPLE))
    decoded = DecodeClip(images=True)(clips)
    engine = get_annotator("vllm", model=model, max_tokens=64, max_model_len=8192)
    notes = engine.annotate(decoded)
    assert len(notes) == len(clips) == 3
    assert all(isinstance(n["caption"], str) and n["model"] == model for n in notes)
