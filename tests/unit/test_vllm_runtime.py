"""Where vLLM can run, read from the installed build (never imported here): vLLM's CPU build
runs without a GPU and its modules ask Ray for none; its GPU build needs a visible GPU."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from rayorch.pipelines import vllm_runtime
from rayorch.pipelines.document.ocr import (
    OcrEngineError,
    engine_memory_options,
    require_vllm_runtime,
)
from rayorch.pipelines.pdf import PdfPipeline
from rayorch.pipelines.video import VideoPipeline
from rayorch.pipelines.video_annotate import AnnotatorError
from rayorch.pipelines.video_annotate import require_vllm_runtime as require_for_video

no_gpu = pytest.mark.skipif(vllm_runtime.gpu_count() > 0, reason="a GPU is visible")


def test_the_cpu_build_runs_here_and_its_modules_ask_for_no_gpu(vllm_build: Any) -> None:
    vllm_build("vllm-cpu")
    assert vllm_runtime.vllm_distribution() == "vllm-cpu"
    require_vllm_runtime()
    require_for_video()
    ocr = PdfPipeline("vllm", engine_options={"model": "DIR"}).compile().options("ocr")
    assert (ocr.num_gpus, ocr.num_cpus) == (0.0, 1.0)
    annotate = VideoPipeline("vllm").compile().options("annotate")
    assert (annotate.num_gpus, annotate.num_cpus) == (0.0, 1.0)
    assert engine_memory_options(None, {}) == {"kv_cache_memory_bytes": 1 << 30}


def test_a_source_build_for_cpu_is_known_by_its_version(vllm_build: Any) -> None:
    vllm_build("vllm", version="0.32.0+cpu")
    assert vllm_runtime.vllm_is_cpu_build()


@no_gpu
def test_the_gpu_build_without_a_gpu_is_refused_naming_the_cpu_build(vllm_build: Any) -> None:
    vllm_build("vllm")
    with pytest.raises(OcrEngineError, match=r"GPU build and no GPU is visible.*"
                       r"rayorch\[model\].*engine='rapidocr'"):
        require_vllm_runtime()
    with pytest.raises(AnnotatorError, match=r"GPU build.*--annotate stats"):
        require_for_video()
    ocr = PdfPipeline("vllm").compile().options("ocr")
    assert ocr.num_gpus == 1.0
    assert VideoPipeline("vllm").compile().options("annotate").num_gpus == 1.0
    assert engine_memory_options(None, {}) == {"gpu_memory_utilization": 0.85}


def test_memory_options_the_caller_gives_are_kept(vllm_build: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    vllm_build("vllm-cpu")
    assert engine_memory_options(0.3, {}) == {"gpu_memory_utilization": 0.3}
    assert engine_memory_options(None, {"kv_cache_memory_bytes": 5}) == {}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert engine_memory_options(None, {}) == {}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_without_vllm_the_error_says_how_to_install_either_build() -> None:
    assert vllm_runtime.vllm_distribution() is None
    with pytest.raises(OcrEngineError, match=r"not installed: pip install 'rayorch\[model\]'"):
        require_vllm_runtime()
