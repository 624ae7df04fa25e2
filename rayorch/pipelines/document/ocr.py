"""OCR engines behind one interface, chosen by name: ``text``, ``rapidocr``, ``vllm``.

An engine turns a batch of page dicts (as produced by
:class:`rayorch.pipelines.pdf.RenderPdf`) into one text per page. Engines that read
pixels set ``needs_image`` so the renderer knows to attach a PNG to each page.

>>> engine = get_engine("text")
>>> engine.recognize([{"page": 1, "text": "Hello"}])
['Hello']
"""

from __future__ import annotations

import base64
import importlib.util
import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from rayorch import RayorchError
from rayorch.actors.usage import count_request_outputs
from rayorch.core.ast_lock import signature as locked_signature
from rayorch.pipelines import vllm_runtime

Page = dict[str, Any]
"""One rendered page: ``{"page", "width", "height", "text"}`` plus ``"png"`` when rendered."""


class OcrEngineError(RayorchError):
    """An OCR engine cannot be chosen or built; the message says what to do instead."""


@runtime_checkable
class OcrEngine(Protocol):
    """Turns a batch of pages into one text per page, in the same order."""

    needs_image: bool

    def recognize(self, pages: list[Page]) -> list[str]: ...


class TextLayerEngine:
    """The text layer PyMuPDF extracted while rendering: exact and fast for born-digital PDFs."""

    needs_image: bool = False

    def recognize(self, pages: list[Page]) -> list[str]:
        return [str(page.get("text", "")) for page in pages]


# -- rapidocr ---------------------------------------------------------------------------

OcrBox = tuple[Sequence[Sequence[float]], str, float]
"""One RapidOCR detection: four corner points, the recognized text, a confidence."""


def join_in_reading_order(boxes: Sequence[OcrBox], *, line_overlap: float = 0.5) -> str:
    """Join detected text boxes top-to-bottom, left-to-right into lines of text.

    Two boxes share a line when they overlap vertically by at least ``line_overlap``
    of the shorter box's height (so a slightly skewed baseline stays one line).
    """
    spans = []
    for points, text, _score in boxes:
        ys = [float(p[1]) for p in points]
        xs = [float(p[0]) for p in points]
        spans.append((min(ys), max(ys), min(xs), text))
    spans.sort(key=lambda s: (s[0], s[2]))
    lines: list[list[tuple[float, float, float, str]]] = []
    for span in spans:
        top, bottom = span[0], span[1]
        if lines:
            line = lines[-1]
            line_top = min(s[0] for s in line)
            line_bottom = max(s[1] for s in line)
            overlap = min(bottom, line_bottom) - max(top, line_top)
            shorter = max(min(bottom - top, line_bottom - line_top), 1e-6)
            if overlap / shorter >= line_overlap:
                line.append(span)
                continue
        lines.append([span])
    return "\n".join(" ".join(s[3] for s in sorted(line, key=lambda s: s[2])) for line in lines)


def corners_rect(points: Sequence[Sequence[float]]) -> tuple[float, float, float, float]:
    """``(x0, y0, x1, y1)`` around a box's corner points (an :data:`OcrBox`'s first item)."""
    xs, ys = [float(p[0]) for p in points], [float(p[1]) for p in points]
    return min(xs), min(ys), max(xs), max(ys)


class RapidOcrEngine:
    """Real OCR of the rendered PNG with ``rapidocr-onnxruntime`` (PP-OCRv4 on ONNX Runtime).

    The detection, classification and recognition weights ship inside the wheel:
    building the engine downloads nothing. ``use_cls`` (180-degree text detection) is
    off by default because rendered PDF pages are upright. Other keyword options go
    to ``RapidOCR(...)`` (e.g. ``text_score=0.6``).
    """

    needs_image: bool = True

    def __init__(self, *, use_cls: bool = False, **rapidocr_options: Any) -> None:
        if importlib.util.find_spec("rapidocr_onnxruntime") is None:
            raise OcrEngineError(
                "the rapidocr engine needs rapidocr-onnxruntime: "
                "pip install 'rayorch[pdf]' (or choose engine='text')"
            )
        from rapidocr_onnxruntime import RapidOCR

        self._ocr = RapidOCR(**rapidocr_options)
        self._use_cls = use_cls

    def recognize(self, pages: list[Page]) -> list[str]:
        return [join_in_reading_order(self.boxes(page["png"])) for page in pages]

    def boxes(self, image: Any, *, scripts: bool = False) -> list[OcrBox]:
        """The text boxes found on one image (PNG bytes or an array), in pixels of it.

        ``scripts``: digits and signs set small and raised (lowered) on their line come out
        as superscripts (subscripts), ``km²`` not ``km2``
        (:func:`rayorch.pipelines.document.scripts.mark_scripts`, from the recogniser's
        per-character boxes)."""
        if not scripts:
            boxes, _elapsed = self._ocr(image, use_cls=self._use_cls)
            return list(boxes or [])
        import cv2
        import numpy as np

        from rayorch.pipelines.document.scripts import mark_scripts

        if isinstance(image, bytes | bytearray):
            image = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_GRAYSCALE)
        gray = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)

        ocr = self._ocr
        # A call with options resets the detector's thresholds and the text score to
        # RapidOCR's defaults unless given: give the ones the engine was built with.
        lines, _elapsed = ocr(image, use_cls=self._use_cls, return_word_box=True,
                              text_score=ocr.text_score,
                              box_thresh=ocr.text_det.postprocess_op.box_thresh,
                              unclip_ratio=ocr.text_det.postprocess_op.unclip_ratio)
        out: list[OcrBox] = []
        for points, text, score, *found in lines or []:
            if len(found) >= 2 and found[0]:
                chars = [(str(c), corners_rect(b)) for c, b in zip(found[1], found[0],
                                                                     strict=False)]
                text = mark_scripts(gray, corners_rect(points), text, chars)
            out.append((points, text, score))
        return out


# -- vllm ---------------------------------------------------------------------------------

DEFAULT_VLM_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
DEFAULT_VLM_PROMPT = (
    "Convert this document page to Markdown. Keep the reading order, headings, lists, "
    "tables (as Markdown tables) and formulas (as LaTeX). Output only the page content."
)


def png_data_url(png: bytes) -> str:
    """``data:image/png;base64,...``: how an image travels in an OpenAI-style chat message."""
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise OcrEngineError("page image is not a PNG: render pages with needs_image=True")
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def build_vlm_messages(page: Page, prompt: str = DEFAULT_VLM_PROMPT) -> list[dict[str, Any]]:
    """One chat conversation asking the VLM to transcribe ``page``'s image.

    The model's own chat template (applied by ``LLM.chat``) places the image tokens,
    so the same message works for Qwen2.5-VL, MinerU2.5 and other chat VLMs.
    """
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": png_data_url(page["png"])}},
                {"type": "text", "text": prompt},
            ],
        }
    ]


_FENCED = re.compile(r"^\s*```[A-Za-z]*[ \t]*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)
_SPECIAL_TOKEN = re.compile(r"<\|[a-z_]+\|>")
_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL)


def parse_vlm_output(text: str) -> str:
    """The page text from a VLM's answer: no code fence, special tokens or reasoning block."""
    text = _THINKING.sub("", text)
    text = _SPECIAL_TOKEN.sub("", text)
    fenced = _FENCED.match(text)
    if fenced:
        text = fenced.group("body")
    return text.strip()


def sampling_problem(max_tokens: Any = None, temperature: Any = None, retries: Any = None,
                     *, flags: bool = False) -> str | None:
    """What is wrong with a model engine's sampling options (those given: not ``None``), or
    ``None``: tokens per answer below 1, a temperature that is not a finite number >= 0,
    retries below 0. ``flags`` names them as the CLI does (``--max-tokens``)."""
    def name(option: str) -> str:
        return f"--{option.replace('_', '-')}" if flags else option

    if max_tokens is not None and (isinstance(max_tokens, bool) or max_tokens < 1):
        return f"{name('max_tokens')} must be a positive number, not {max_tokens}"
    if temperature is not None and (
            isinstance(temperature, bool) or not isinstance(temperature, int | float)
            or not math.isfinite(temperature) or temperature < 0):
        return f"{name('temperature')} must be a number >= 0, not {temperature}"
    if retries is not None and retries < 0:
        return f"{name('retries')} must be >= 0, not {retries}"
    return None


def require_vllm_runtime(
    instead: str = "choose engine='rapidocr' (CPU OCR) or 'text'",
    module: str = "the OCR module",
    error: type[RayorchError] = OcrEngineError,
) -> None:
    """Raise ``error`` unless vLLM can run here: installed, and its CPU build or a visible
    GPU (:func:`rayorch.pipelines.vllm_runtime.require_vllm_runtime`); ``instead`` and
    ``module`` name the alternatives without vLLM and the module that needs it."""
    vllm_runtime.require_vllm_runtime(instead, module, error)


class VllmEngine:
    """A vision-language model served in-process by vLLM: one engine per actor.

    A batch of pages becomes one batched ``LLM.chat`` call (greedy unless ``temperature``). The
    model name is an option, e.g. ``Qwen/Qwen2.5-VL-7B-Instruct`` or
    ``opendatalab/MinerU2.5-2509-1.2B`` (whole-page transcription; MinerU's
    two-step layout flow is ``--ocr mineru``).
    ``max_model_len`` defaults to the model's own limit; memory options as
    :class:`VllmChat` takes them. Other keyword options go to ``vllm.LLM``.
    """

    needs_image: bool = True

    def __init__(
        self,
        *,
        model: str = DEFAULT_VLM_MODEL,
        prompt: str = DEFAULT_VLM_PROMPT,
        max_tokens: int = 4096,
        temperature: float = 0.0,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        **llm_options: Any,
    ) -> None:
        require_vllm_runtime()
        self.model = model
        self.prompt = prompt
        sampling = {"temperature": temperature} if temperature else None
        self._chat = VllmChat(model, images=1, max_tokens=max_tokens,
                              gpu_memory_utilization=gpu_memory_utilization,
                              max_model_len=max_model_len, sampling=sampling, **llm_options)

    def recognize(self, pages: list[Page]) -> list[str]:
        return self._chat.answers([build_vlm_messages(page, self.prompt) for page in pages])

    async def recognize_async(self, pages: list[Page]) -> list[str]:
        """:meth:`recognize` for a module with several batches in flight: the batches'
        pages share the engine (:class:`ContinuousChat`)."""
        if getattr(self, "_continuous", None) is None:
            self._continuous = ContinuousChat(self._chat)
        return await self._continuous.answers(
            [build_vlm_messages(page, self.prompt) for page in pages])


DEFAULT_GPU_MEMORY_UTILIZATION = 0.85
"""The fraction of GPU memory a GPU engine takes (weights, activations, KV cache)."""
DEFAULT_CPU_KV_CACHE_BYTES = 1 << 30
"""The KV cache of a CPU engine: 1 GiB (vLLM's CPU build otherwise reserves a fraction of
the whole machine's memory, ``gpu_memory_utilization`` of it, and fails when that much is
not free)."""


def engine_memory_options(gpu_memory_utilization: float | None,
                          llm_options: dict[str, Any]) -> dict[str, Any]:
    """The memory options a ``vllm.LLM`` gets: the caller's, else a default per build.

    >>> engine_memory_options(0.5, {})
    {'gpu_memory_utilization': 0.5}
    """
    if gpu_memory_utilization is not None:
        return {"gpu_memory_utilization": gpu_memory_utilization}
    if "kv_cache_memory_bytes" in llm_options:
        return {}
    if not vllm_runtime.vllm_is_cpu_build():
        return {"gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION}
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):  # vLLM's own setting for a CPU engine
        return {}
    return {"kv_cache_memory_bytes": DEFAULT_CPU_KV_CACHE_BYTES}


class VllmChat:
    """A (vision-)language model served in-process by vLLM, answering batches of chats.

    Shared by the OCR engine and the video captioner, and the way to wrap vLLM in your own
    module: one ``vllm.LLM`` per actor, in the actor's own process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set), greedy decoding (``sampling``: other
    ``vllm.SamplingParams`` fields), at most ``images`` images per conversation (0: a text
    model). ``max_model_len=None`` takes the model's own limit. ``gpu_memory_utilization=None``
    means 0.85 of a GPU, or on vLLM's CPU build a 1 GiB KV cache (set
    ``kv_cache_memory_bytes``, or vLLM's ``VLLM_CPU_KVCACHE_SPACE``, for another size).
    Other keyword options go to ``vllm.LLM``. Check :func:`require_vllm_runtime` first for
    a clear error.
    """

    def __init__(self, model: str, *, images: int = 0, max_tokens: int = 256,
                 gpu_memory_utilization: float | None = None, max_model_len: int | None = None,
                 sampling: dict[str, Any] | None = None, **llm_options: Any) -> None:
        require_vllm_runtime("run this module without a model", "this module")
        vllm_runtime.use_in_process_engine()
        vllm_runtime.prepare_vllm()
        import vllm

        options = engine_memory_options(gpu_memory_utilization, llm_options)
        if images:
            options["limit_mm_per_prompt"] = {"image": images}
        if max(llm_options.get("tensor_parallel_size", 1),
               llm_options.get("pipeline_parallel_size", 1)) == 1:
            options["distributed_executor_backend"] = "uni"  # the engine in this process
        if max_model_len is not None:
            options["max_model_len"] = max_model_len
        options.update(llm_options)
        self._llm: Any = vllm.LLM(model=model, **options)
        self._sampling = vllm.SamplingParams(
            **{"temperature": 0.0, "max_tokens": max_tokens, **(sampling or {})})

    def outputs(self, conversations: list[list[dict[str, Any]]]) -> list[Any]:
        """One batched ``LLM.chat``: vLLM's ``RequestOutput`` per conversation, in order.

        A conversation vLLM refuses (e.g. a prompt over ``max_model_len``) raises for the
        whole batch; the module's recovery then runs its records alone, so only that one
        fails (the others' requests are withdrawn from the engine first).
        """
        outputs = list(self._llm.chat(conversations, self._sampling, use_tqdm=False))
        count_request_outputs(outputs)  # tokens in and out, sent with the batch's result
        return outputs

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` (in this process)."""
        return self._llm

    @property
    def sampling(self) -> Any:
        """The default ``vllm.SamplingParams`` (greedy)."""
        return self._sampling

    def answers(self, conversations: list[list[dict[str, Any]]]) -> list[str]:
        """One batched ``LLM.chat``; each answer as :func:`parse_vlm_output` cleans it."""
        return [parse_vlm_output(out.outputs[0].text) for out in self.outputs(conversations)]


class ContinuousChat:
    """Batches in flight at once sharing one in-process engine (continuous batching).

    Wraps a built :class:`VllmChat`. Each :meth:`answers` call enqueues its conversations
    at once (``LLM.enqueue_chat``) and waits for its own; one stepping task on the running
    event loop calls the engine's ``step()`` while any request is unfinished, so requests
    of other batches join between steps and the engine never waits for a batch boundary.
    Everything that touches the engine runs on that one loop (the module's own, see
    ``max_inflight`` in docs/topics/ACTORS.md), so the engine is never used from two
    threads. :meth:`timed_outputs` says when each request entered and left the engine
    (the busy-fraction benchmark, bench/engine_real.py, reads them).
    """

    def __init__(self, chat: VllmChat) -> None:
        self.chat = chat
        self._waiting: dict[str, Any] = {}  # request id -> asyncio.Future
        self._stepper: Any = None
        self.peak = 0
        """The most requests inside the engine at once (several batches' when they overlap)."""

    async def outputs(self, conversations: list[list[dict[str, Any]]],
                      sampling: Any = None) -> list[Any]:
        """vLLM's ``RequestOutput`` per conversation (``sampling``: one or one each)."""
        return [out for out, _, _ in await self.timed_outputs(conversations, sampling)]

    async def timed_outputs(self, conversations: list[list[dict[str, Any]]],
                            sampling: Any = None) -> list[tuple[Any, float, float]]:
        """``(RequestOutput, enqueued, finished)`` per conversation (monotonic seconds)."""
        import asyncio
        import time

        loop = asyncio.get_running_loop()
        enqueued = time.monotonic()
        ids = self.chat.llm.enqueue_chat(conversations, sampling or self.chat.sampling,
                                         use_tqdm=False)
        futures = [loop.create_future() for _ in ids]
        # enqueue_chat gives the engine's ids ("<ours>-<random>"); outputs carry ours.
        self._waiting.update((rid.rsplit("-", 1)[0], f) for rid, f in zip(ids, futures))
        self.peak = max(self.peak, len(self._waiting))
        if self._stepper is None or self._stepper.done():
            self._stepper = loop.create_task(self._step())
        done = await asyncio.gather(*futures)
        count_request_outputs(out for out, _ in done)
        return [(out, enqueued, finished) for out, finished in done]

    async def answers(self, conversations: list[list[dict[str, Any]]]) -> list[str]:
        """Like :meth:`VllmChat.answers`, awaiting this batch's requests only."""
        return [parse_vlm_output(out.outputs[0].text) for out in await self.outputs(conversations)]

    async def _step(self) -> None:
        import asyncio
        import time

        engine = self.chat.llm.llm_engine
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in self._waiting:
                        self._waiting.pop(out.request_id).set_result((out, time.monotonic()))
                await asyncio.sleep(0)  # batches that arrived meanwhile enqueue here
        except Exception as exc:  # the engine failed: every waiting batch learns why
            self._fail_waiting(exc)
        else:
            self._fail_waiting(OcrEngineError(
                f"the vLLM engine finished without answering {len(self._waiting)} requests"))

    def _fail_waiting(self, exc: Exception) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(exc)
        self._waiting.clear()


class EngineRegistry:
    """Engines of one kind by name: build one with checked options, or ask what it reads.

    >>> ENGINE_REGISTRY.build("text").needs_image
    False
    """

    def __init__(self, kind: str, engines: dict[str, Callable[..., Any]],
                 error: type[RayorchError]) -> None:
        self.kind, self.engines, self.error = kind, engines, error

    def engine_class(self, name: str) -> Any:
        try:
            return self.engines[name]
        except KeyError:
            valid = ", ".join(repr(n) for n in self.engines)
            raise self.error(f"unknown {self.kind} {name!r}: choose one of {valid}") from None

    def build(self, name: str, **options: Any) -> Any:
        """The engine called ``name`` built with ``options`` (checked against its signature)."""
        engine_class = self.engine_class(name)
        try:
            locked_signature(engine_class).bind(**options)
        except TypeError as exc:
            raise self.error(f"bad options for {self.kind} {name!r}: {exc}") from None
        return engine_class(**options)

    def needs_image(self, name: str) -> bool:
        """Whether engine ``name`` reads pixels (known without building the engine)."""
        return bool(self.engine_class(name).needs_image)


# -- choosing an engine -------------------------------------------------------------------

ENGINES: dict[str, Callable[..., OcrEngine]] = {
    "text": TextLayerEngine,
    "rapidocr": RapidOcrEngine,
    "vllm": VllmEngine,
}


ENGINE_REGISTRY = EngineRegistry("OCR engine", ENGINES, OcrEngineError)


def get_engine(name: str, **options: Any) -> OcrEngine:
    """Build the engine called ``name`` with its ``options``.

    >>> get_engine("text").needs_image
    False
    """
    engine: OcrEngine = ENGINE_REGISTRY.build(name, **options)
    return engine


def engine_needs_image(name: str) -> bool:
    """Whether engine ``name`` reads the page image (known without building the engine)."""
    return ENGINE_REGISTRY.needs_image(name)
