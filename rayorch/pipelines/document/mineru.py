"""``--ocr mineru``: MinerU2.5's two steps, layout and recognition, on ONE vLLM engine.

:class:`MineruEngine` is one actor module serving both Calls of the region grain
(:meth:`rayorch.pipelines.pdf.PdfPipeline.regions`): ``step="layout"`` turns page items into
region items, ``step="recognise"`` region items into blocks. One pool, one engine, one copy of
the weights. The module is async: with ``max_inflight`` > 1 the actor runs several batches at
once, of either Call, and every request of every batch enters the same engine
(:class:`~rayorch.pipelines.document.ocr.ContinuousChat`), so layout requests of later pages
and recognition requests of earlier ones are decoded together.

* Layout: the page resized to 1036x1036 with ``\\nLayout Detection:``; the box lines (0-1000
  grid) become region items in the model's reading order, each crop cut from the
  full-resolution page.
* Recognition: each crop, upright and sized as MinerU sizes it, with the prompt of its kind
  (text, table: OTSL -> HTML, formula: LaTeX); figures keep their crop.

:class:`MineruSteps` holds the steps and the policy below over any engine (its unit tests run
it on scripted answers); :class:`MineruEngine` binds it to vLLM.

Quality policy, per request: an answer that fails validation (no readable layout, no OTSL
table, a repetition loop, the token limit: :mod:`~rayorch.pipelines.document.mineru_blocks`)
is asked again at a higher temperature (``retries``); past them a page becomes one
whole-page region and a region falls back to its text layer, OCR of its crop or of the page,
or an equation to its image. The block names its ``fallback`` and ``cause`` (the assembler
counts them: ``--max-fallback-share``). A region's failure never fails its siblings; only an
input that is no page or region item fails, alone.

:class:`RequestLog` is the engine's own record (requests by step, the most inside at once,
how often one step's request entered while the other's was inside, each request's times):
the tests and ``bench/mineru_orchestration.py`` read it.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rayorch import RecordFailure
from rayorch.pipelines.document.layout import (
    DROPPED_KINDS,
    open_png,
    page_number,
    unreadable_page,
)
from rayorch.pipelines.document.mineru_blocks import (
    REPETITION,
    SYSTEM_PROMPT,
    InvalidAnswer,
    fallback_for,
    finish_problem,
    layout_boxes,
    layout_image,
    layout_regions,
    prompt_key,
    prompts_for,
    read_answer,
    request_image,
    sampling_ladder,
    sampling_penalties,
    words_text,
)
from rayorch.pipelines.document.ocr import (
    OcrEngineError,
    png_data_url,
    require_vllm_runtime,
    sampling_problem,
)
from rayorch.pipelines.document.recognise import region_problem
from rayorch.pipelines.document.regions import CropOcr, whole_page_region

Block = dict[str, Any]
Region = dict[str, Any]
STEPS = ("layout", "recognise")
MAX_CAUSE = 300
"""An engine error's text is cut to this many characters in a block's cause."""


def check_sampling(max_tokens: int | None, temperature: float, retries: int) -> None:
    """``OcrEngineError`` unless the sampling options are usable (before any model loads:
    :func:`~rayorch.pipelines.document.ocr.sampling_problem`)."""
    problem = sampling_problem(max_tokens, temperature, retries)
    if problem is not None:
        raise OcrEngineError(problem)


class RequestLog:
    """What went through one engine: requests per step, the most inside at once (``peak``),
    how many entered while one of the other step was inside (``mixed``), and each request's
    ``(step, key, page, attempt, enqueued, finished, tokens, finish)`` (the latest ``keep``).

    ``path``: each record is also appended there as a JSON line, for a reader in another
    process (times are ``time.monotonic()``: one clock for every process of a Linux machine).
    """

    def __init__(self, path: str | None = None, keep: int = 10_000) -> None:
        self.inside: Counter[str] = Counter()
        self.total: Counter[str] = Counter()
        self.mixed = 0
        self.peak = 0
        self.records: deque[dict[str, Any]] = deque(maxlen=keep)
        self.path = path
        # opened once, a line at a time (each record whole for a reader in another process)
        self._out = open(path, "a", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115

    def enter(self, step: str) -> None:
        if any(n for other, n in self.inside.items() if other != step):
            self.mixed += 1
        self.inside[step] += 1
        self.total[step] += 1
        self.peak = max(self.peak, sum(self.inside.values()))

    def leave(self, step: str, record: dict[str, Any]) -> None:
        self.inside[step] -= 1
        self.records.append(record)
        if self._out is not None:
            self._out.write(json.dumps(record) + "\n")

    def stats(self) -> dict[str, Any]:
        """``{"requests": {step: n}, "peak", "mixed"}``."""
        return {"requests": dict(self.total), "peak": self.peak, "mixed": self.mixed}


Ask = Callable[[str, bytes, float, str, int], Awaitable[tuple[str, str | None]]]
"""``ask(key, png, temperature, tag, attempt)``: one request's ``(text, finish_reason)``."""


class MineruSteps:
    """The two steps and the quality policy over any engine (``ask``: one request).

    ``temperature`` is the first attempt's, ``retries`` the attempts more (each hotter:
    :func:`~rayorch.pipelines.document.mineru_blocks.sampling_ladder`); ``max_tokens`` names
    the limit in a cause. :class:`MineruEngine` is these steps on a vLLM engine.
    """

    def __init__(self, ask: Ask, *, max_tokens: int | None = None, temperature: float = 0.0,
                 retries: int = 1) -> None:
        check_sampling(max_tokens, temperature, retries)
        self.ask = ask
        self.max_tokens = max_tokens
        self.temperatures = sampling_ladder(float(temperature), retries)
        self._crop_ocr = CropOcr()
        self._ocr_thread = ThreadPoolExecutor(1, thread_name_prefix="rayorch-mineru-ocr")

    async def __call__(self, items: list[Any], *, step: str = "layout") -> list[Any]:
        if step not in STEPS:
            raise OcrEngineError(f"unknown MinerU step {step!r}: choose one of "
                                 f"{', '.join(STEPS)}")
        return list(await asyncio.gather(*(self._one(step, item) for item in items)))

    async def _one(self, step: str, item: Any) -> Any:
        """One page or region through ``step``; whatever goes wrong stays with it (a page
        becomes its whole-page region, a region OCR of its crop)."""
        try:
            return await (self.layout(item) if step == "layout" else self.recognise(item))
        except Exception as exc:
            cause = f"{step}: {_said(exc)}"
            if step == "recognise":
                return await self._ocr(item, cause, "ocr-crop")
            if isinstance(item, dict) and "png" in item and "page" in item:
                return [whole_page_region(item, cause)]
            return RecordFailure(cause)

    async def layout(self, page: Any) -> list[Region] | RecordFailure:
        """One page item's region items (a whole-page region when its layout fails)."""
        if (refused := unreadable_page(page)) is not None:
            return refused
        number = page_number(page)
        try:
            image = open_png(page["png"])
            request = layout_image(page["png"])
        except Exception as exc:  # a page image that cannot be read: the page's fallback
            return [whole_page_region(page, f"layout: page {number}: {_said(exc)}")]
        boxes, _, cause = await self._answer("layout", request, layout_boxes,
                                             f"layout/{number}")
        if boxes is None:
            return [whole_page_region(page, f"layout: page {number}: {cause}")]
        return layout_regions(page, boxes, image)

    async def recognise(self, region: Any) -> Block:
        """One region item's block (a fallback block when it cannot be read)."""
        where = (f"page {region.get('page', '?')} region {region.get('order', '?')}"
                 if isinstance(region, dict) else "a region")
        problem = region_problem(region)
        if problem is not None:
            return await self._ocr(region, f"recognise: {where}: {problem}", "ocr-crop")
        kind = str(region["kind"])
        if region.get("fallback"):  # the layout step could not read its page
            return await self._fallback(region, kind, str(region.get("cause") or "layout"))
        if kind in DROPPED_KINDS:  # the pipeline drops these before this step
            return _block(region, "none", text="")
        key = prompt_key(kind)
        try:
            request = request_image(region)
        except Exception as exc:  # a crop that is no image
            return await self._fallback(region, kind, f"recognise: {where}: {_said(exc)}")
        if key is None:  # a figure: its crop
            return _block(region, "crop", image=bytes(region["crop"]))
        content, attempts, cause = await self._answer(
            key, request, lambda text: read_answer(kind, text), f"{key}/{where}")
        if content is None:
            return await self._fallback(region, kind, f"recognise: {where} ({kind}): {cause}")
        block = _block(region, "mineru", **content)
        if attempts > 1:
            block["attempts"] = attempts
        return block

    async def _answer(self, key: str, png: bytes, read: Callable[[str], Any], tag: str
                      ) -> tuple[Any, int, str | None]:
        """``(read(answer), attempts, None)`` for the first answer that passes, else
        ``(None, attempts, cause)`` naming each attempt's problem."""
        problems = []
        for attempt, temperature in enumerate(self.temperatures, 1):
            try:
                text, finish_reason = await self.ask(key, png, temperature, tag, attempt)
            except Exception as exc:  # the engine refused it: asking again will not help
                problems.append(f"try {attempt}: the engine failed: {_said(exc)}")
                return None, attempt, "; ".join(problems)
            problem = finish_problem(finish_reason, self.max_tokens)
            if problem is None:
                try:
                    return read(text), attempt, None
                except InvalidAnswer as exc:
                    problem = str(exc)
                except Exception as exc:  # its text may quote the answer: name its type only
                    problem = f"an unreadable answer ({type(exc).__name__})"
            problems.append(f"try {attempt} at temperature {temperature:g}: {problem}")
        return None, len(self.temperatures), "; ".join(problems)

    async def _fallback(self, region: Region, kind: str, cause: str) -> Block:
        """What stands in for a region no answer passed for (:func:`fallback_for`)."""
        how = fallback_for(region, kind)
        if how == "text-layer":
            return _block(region, "text-layer", fallback=how, cause=cause,
                          text=words_text(region.get("words") or []))
        if how == "crop-image":
            try:
                open_png(region["crop"])
                return _block(region, "crop", fallback=how, cause=cause,
                              image=bytes(region["crop"]))
            except ValueError as exc:
                cause = f"{cause}; its crop: {exc}"
                how = "ocr-crop"
        return await self._ocr(region, cause, how)

    async def _ocr(self, region: Any, cause: str, how: str) -> Block:
        """RapidOCR of the region's crop, off the event loop (the engine keeps stepping)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._ocr_thread, lambda: self._crop_ocr.block(region, cause, fallback=how))


class MineruEngine(MineruSteps):
    """MinerU2.5's layout and recognition on one in-process vLLM engine (an async module).

    ``model``: a MinerU2.5 directory or hub id (``opendatalab/MinerU2.5-2509-1.2B``).
    ``max_tokens``: per answer (``None``: up to the model's context, as MinerU does);
    ``temperature``: the first attempt's; ``retries``: attempts more, each 0.4 hotter;
    ``prompts``: any of ``layout``, ``text``, ``table``, ``equation`` instead of MinerU's.
    ``test_regexes``: TEST OPTION ONLY, vLLM's structured outputs hold the answers of each
    request kind to its regex (:data:`~rayorch.pipelines.document.mineru_blocks.TEST_REGEXES`:
    a model with random weights writes no layout). ``request_log``: a file the :class:`RequestLog`
    appends to. Memory options and other keyword options go to
    :class:`~rayorch.pipelines.document.ocr.VllmChat` (``vllm.LLM``).
    """

    def __init__(self, *, model: str, max_tokens: int | None = None, temperature: float = 0.0,
                 retries: int = 1, prompts: dict[str, str] | None = None,
                 test_regexes: dict[str, str] | None = None, request_log: str | None = None,
                 gpu_memory_utilization: float | None = None, max_model_len: int | None = None,
                 **llm_options: Any) -> None:
        super().__init__(self._request, max_tokens=max_tokens, temperature=temperature,
                         retries=retries)
        self.prompts = prompts_for(prompts)
        require_vllm_runtime("choose --ocr layout (CPU models from wheels)", "the mineru module")
        from rayorch.pipelines.document.ocr import ContinuousChat, VllmChat

        options = {"limit_mm_per_prompt": {"image": 1, "video": 0}, **llm_options}
        self.chat = ContinuousChat(VllmChat(
            model, images=1, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, **options))
        import vllm
        from vllm.sampling_params import RepetitionDetectionParams, StructuredOutputsParams

        self._vllm: Any = vllm
        self._loop_check = RepetitionDetectionParams(**REPETITION)
        self._rules = {key: StructuredOutputsParams(regex=regex)
                       for key, regex in (test_regexes or {}).items()}
        self.log = RequestLog(request_log)

    async def _request(self, key: str, png: bytes, temperature: float, tag: str,
                       attempt: int) -> tuple[str, str | None]:
        """One request in the engine: MinerU's prompt and penalties for ``key``, a seed of
        ``tag`` and ``attempt`` (the same request samples the same way in any schedule)."""
        greedy = temperature == 0.0
        sampling = self._vllm.SamplingParams(
            temperature=temperature, top_p=0.01 if greedy else 1.0, top_k=1 if greedy else 0,
            max_tokens=self.max_tokens, seed=zlib.crc32(f"{tag}/{attempt}".encode()),
            skip_special_tokens=False, repetition_detection=self._loop_check,
            structured_outputs=self._rules.get(key),
            **sampling_penalties(key))
        conversation: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": png_data_url(png)}},
                {"type": "text", "text": self.prompts[key]}]}]
        step = "layout" if key == "layout" else "recognise"
        self.log.enter(step)
        record: dict[str, Any] = {"step": step, "key": key, "tag": tag, "attempt": attempt,
                                  "enqueued": time.monotonic()}
        try:
            [(out, _, finished)] = await self.chat.timed_outputs([conversation], sampling)
            completion = out.outputs[0]
            record.update(finished=finished, tokens=len(completion.token_ids),
                          finish=completion.finish_reason)
            return str(completion.text), completion.finish_reason
        finally:
            record.setdefault("finished", time.monotonic())
            self.log.leave(step, record)


def _said(exc: BaseException) -> str:
    """An exception as a block's cause: its type and its text, cut to :data:`MAX_CAUSE`."""
    return f"{type(exc).__name__}: {exc}"[:MAX_CAUSE]


def _block(region: Region, engine: str, *, fallback: str | None = None,
           cause: str | None = None, **content: Any) -> Block:
    block = {"page": region["page"], "order": region["order"], "kind": region["kind"],
             "bbox": list(region["bbox"]), "engine": engine, "fallback": fallback, **content}
    if cause is not None:
        block["cause"] = cause
    return block


__all__ = ["STEPS", "Ask", "MineruEngine", "MineruSteps", "RequestLog", "check_sampling"]
