"""Clip annotation engines behind one interface, chosen by name: ``stats``, ``ocr``, ``vllm``.

An engine turns a batch of decoded clips (as :func:`rayorch.pipelines.video_decode.read_clip`
gives them, plus ``video``/``clip``/``start_s``/``end_s``) into one annotation dict per
clip. Engines that read pixels set ``needs_image`` so keyframes are encoded as JPEG.

>>> engine = get_annotator("stats")
>>> engine.annotate([{"signals": {"motion": 0.1, "brightness": 20.0, "sharpness": 900.0}}])
[{'flags': ['dark', 'static']}]
"""

from __future__ import annotations

import base64
import importlib.util
import io
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from rayorch import RayorchError
from rayorch.pipelines.document import ocr
from rayorch.pipelines.document.ocr import join_in_reading_order

ClipFrames = dict[str, Any]
"""``{"video", "clip", "start_s", "end_s", "frames", "signals", "keyframes": [{"t", "jpeg"?}]}``."""


class AnnotatorError(RayorchError):
    """An annotation engine cannot be chosen or built; the message says what to do instead."""


@runtime_checkable
class ClipAnnotator(Protocol):
    """Turns a batch of clips into one annotation dict per clip, in the same order."""

    needs_image: bool

    def annotate(self, clips: list[ClipFrames]) -> list[dict[str, Any]]: ...


class StatsAnnotator:
    """No model: flags derived from the cheap signals, for filtering (CPU, the default).

    ``dark``/``bright``: mean grey level under ``dark_below`` / over ``bright_above``;
    ``static``: motion under ``static_below`` grey levels per frame; ``blurry``:
    sharpness (Laplacian variance at 160 px wide) under ``blurry_below``.
    """

    needs_image: bool = False

    def __init__(self, *, dark_below: float = 40.0, bright_above: float = 215.0,
                 static_below: float = 0.5, blurry_below: float = 30.0) -> None:
        self.dark_below, self.bright_above = dark_below, bright_above
        self.static_below, self.blurry_below = static_below, blurry_below

    def annotate(self, clips: list[ClipFrames]) -> list[dict[str, Any]]:
        return [{"flags": self.flags(clip["signals"])} for clip in clips]

    def flags(self, signals: dict[str, float]) -> list[str]:
        flags = []
        if signals["brightness"] < self.dark_below:
            flags.append("dark")
        if signals["brightness"] > self.bright_above:
            flags.append("bright")
        if signals["motion"] < self.static_below:
            flags.append("static")
        if signals["sharpness"] < self.blurry_below:
            flags.append("blurry")
        return flags


def _polygon_area(points: Any) -> float:
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    n = len(xs)
    return abs(sum(xs[i] * ys[(i + 1) % n] - xs[(i + 1) % n] * ys[i] for i in range(n))) / 2


class OcrAnnotator:
    """On-screen text in each keyframe with RapidOCR (CPU), for filtering text-heavy videos.

    Gives ``{"texts": [text per keyframe], "text_coverage": the largest fraction of a
    keyframe covered by text boxes}``. Options go to ``RapidOCR(...)``.
    """

    needs_image: bool = True

    def __init__(self, **rapidocr_options: Any) -> None:
        if importlib.util.find_spec("rapidocr_onnxruntime") is None:
            raise AnnotatorError("the ocr engine needs rapidocr-onnxruntime: "
                                 "pip install 'rayorch[pdf]' (or choose --annotate stats)")
        from rapidocr_onnxruntime import RapidOCR

        self._ocr = RapidOCR(**rapidocr_options)

    def annotate(self, clips: list[ClipFrames]) -> list[dict[str, Any]]:
        from PIL import Image

        results = []
        for clip in clips:
            texts: list[str] = []
            coverage = 0.0
            for keyframe in clip["keyframes"]:
                jpeg = keyframe["jpeg"]
                width, height = Image.open(io.BytesIO(jpeg)).size
                boxes, _elapsed = self._ocr(jpeg, use_cls=False)
                boxes = boxes or []
                texts.append(join_in_reading_order(boxes))
                covered = sum(_polygon_area(points) for points, _t, _s in boxes)
                coverage = max(coverage, min(1.0, covered / max(1, width * height)))
            results.append({"texts": texts, "text_coverage": round(coverage, 4)})
        return results


DEFAULT_CAPTION_MODEL = "Qwen/Qwen2.5-VL-3B-Instruct"
DEFAULT_CAPTION_PROMPT = (
    "These images are keyframes of one video clip, in time order. Describe the clip in one "
    "or two sentences: the scene, the main subjects and what happens. Output only the caption."
)


def jpeg_data_url(jpeg: bytes) -> str:
    """``data:image/jpeg;base64,...``: how a keyframe travels in an OpenAI-style chat message."""
    if not jpeg.startswith(b"\xff\xd8"):
        raise AnnotatorError("keyframe image is not a JPEG: decode clips with images=True")
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")


def build_caption_messages(clip: ClipFrames, prompt: str = DEFAULT_CAPTION_PROMPT
                           ) -> list[dict[str, Any]]:
    """One chat conversation: the clip's keyframes (in time order), then the prompt."""
    content: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": jpeg_data_url(k["jpeg"])}}
        for k in clip["keyframes"]
    ]
    if not content:
        raise AnnotatorError(f"clip {clip.get('clip')} of {clip.get('video')} has no keyframes")
    content.append({"type": "text", "text": prompt})
    return [{"role": "user", "content": content}]


def require_vllm_runtime() -> None:
    """Raise :class:`AnnotatorError` unless vLLM can run here (its CPU build or a GPU)."""
    ocr.require_vllm_runtime("choose --annotate stats (CPU) or ocr", "the annotate module",
                             AnnotatorError)


class VllmCaptioner:
    """A captioning VLM served in-process by vLLM: one engine per actor, batched generate.

    A batch of clips becomes one ``LLM.chat`` call (greedy decoding), each conversation
    holding the clip's keyframes as images. ``max_model_len`` defaults to the model's own
    limit; memory options as :class:`~rayorch.pipelines.document.ocr.VllmChat` takes them. Other
    keyword options go to ``vllm.LLM``.
    """

    needs_image: bool = True

    def __init__(self, *, model: str = DEFAULT_CAPTION_MODEL,
                 prompt: str = DEFAULT_CAPTION_PROMPT, max_tokens: int = 128,
                 max_images: int = 3, gpu_memory_utilization: float | None = None,
                 max_model_len: int | None = None, **llm_options: Any) -> None:
        require_vllm_runtime()
        self.model, self.prompt, self.max_images = model, prompt, max_images
        self._chat = ocr.VllmChat(model, images=max_images, max_tokens=max_tokens,
                                  gpu_memory_utilization=gpu_memory_utilization,
                                  max_model_len=max_model_len, **llm_options)

    def annotate(self, clips: list[ClipFrames]) -> list[dict[str, Any]]:
        captions = self._chat.answers(self._conversations(clips))
        return [{"caption": caption, "model": self.model} for caption in captions]

    def _conversations(self, clips: list[ClipFrames]) -> list[list[dict[str, Any]]]:
        return [build_caption_messages(limit_keyframes(c, self.max_images), self.prompt)
                for c in clips]

    async def annotate_async(self, clips: list[ClipFrames]) -> list[dict[str, Any]]:
        """:meth:`annotate` for a module with several batches in flight: the batches' clips
        share the engine (:class:`~rayorch.pipelines.document.ocr.ContinuousChat`)."""
        if getattr(self, "_continuous", None) is None:
            self._continuous = ocr.ContinuousChat(self._chat)
        captions = await self._continuous.answers(self._conversations(clips))
        return [{"caption": caption, "model": self.model} for caption in captions]


def limit_keyframes(clip: ClipFrames, most: int) -> ClipFrames:
    """The clip with at most ``most`` keyframes, spread evenly (first and last kept)."""
    keyframes = clip["keyframes"]
    if len(keyframes) <= most:
        return clip
    if most == 1:
        return {**clip, "keyframes": [keyframes[len(keyframes) // 2]]}
    step = (len(keyframes) - 1) / (most - 1)
    return {**clip, "keyframes": [keyframes[round(i * step)] for i in range(most)]}


ANNOTATORS: dict[str, Callable[..., ClipAnnotator]] = {
    "stats": StatsAnnotator,
    "ocr": OcrAnnotator,
    "vllm": VllmCaptioner,
}


ANNOTATOR_REGISTRY = ocr.EngineRegistry("annotation engine", ANNOTATORS, AnnotatorError)


def get_annotator(name: str, **options: Any) -> ClipAnnotator:
    """Build the annotation engine called ``name`` with its ``options``."""
    annotator: ClipAnnotator = ANNOTATOR_REGISTRY.build(name, **options)
    return annotator


def annotator_needs_image(name: str) -> bool:
    """Whether engine ``name`` reads keyframe pixels (known without building the engine)."""
    return ANNOTATOR_REGISTRY.needs_image(name)
