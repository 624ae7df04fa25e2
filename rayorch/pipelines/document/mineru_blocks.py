"""MinerU2.5's two steps without a model: what each request asks, how its answer is read and
checked, and what stands in for an answer that fails the checks.

The engine module (:mod:`rayorch.pipelines.document.mineru`) sends the requests; everything
here is pure and runs without vLLM. The prompts, the layout parser (box lines on a 0-1000 grid,
duplicates and table-internal boxes removed), OTSL -> HTML and the LaTeX and text clean-ups are
mineru-vl-utils' (Apache-2.0), imported at first use (:func:`mineru_helper`).

An answer fails validation (:class:`InvalidAnswer`) when the engine stopped it at the token
limit or on a repetition loop (:func:`finish_problem`), when a layout has no box line this code
can read, or when a table is not OTSL. Its message names the problem, never the model's text:
model output is untrusted and never printed. After the retries (:func:`sampling_ladder`) a
region falls back (:func:`fallback_for`): the text layer inside its box when it is usable, else
OCR of its crop (``ocr-crop``; ``ocr-page`` for a page whose layout failed), and an equation
keeps its crop as an image (``crop-image``).

>>> sampling_ladder(0.0, 2)
[0.0, 0.4, 0.8]
>>> region_kind_of("paragraph_title"), region_kind_of("chart"), region_kind_of("list")
('title', 'figure', None)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rayorch import RayorchError
from rayorch.pipelines.document.ocr import parse_vlm_output
from rayorch.pipelines.document.recognise import usable_words_text

LAYOUT_IMAGE_SIZE = (1036, 1036)
"""The page image the layout request carries (MinerU2.5's)."""
PROMPT_KEYS = {"layout": "[layout]", "text": "[default]", "table": "table",
               "equation": "equation"}
"""The prompts a request may carry (``prompts=`` keys) and mineru-vl-utils' name of each."""
SYSTEM_PROMPT = "You are a helpful assistant."
"""The system message of every request (mineru-vl-utils' ``DEFAULT_SYSTEM_PROMPT``)."""

TEST_REGEXES: dict[str, str] = {
    "layout": (r"(<\|box_start\|>[0-4]\d\d [0-4]\d\d [5-9]\d\d [5-9]\d\d<\|box_end\|>"
               r"<\|ref_start\|>(text|title|table|equation|image)<\|ref_end\|>"
               r"<\|rotate_up\|>\n){1,2}"),
    "text": r"[A-Z][a-z]{1,8}( [a-z]{1,8}){0,5}\.",
    "table": r"(<fcel>[a-z]{1,6}){2,3}<nl>(<fcel>[a-z]{1,6}){2,3}<nl>",
    "equation": r"[a-z] = [a-z]\^\{[0-9]\}",
}
"""A TEST OPTION ONLY (``test_regexes=``, ``rayorch run pdf --test-regexes``): vLLM's
structured outputs hold each answer to a short valid one (one or two box lines of valid
boxes, a sentence, a 2-row OTSL table, a formula), because a model with random weights (the
test-model kit's ``mineru``) never writes a layout and rarely ends an answer: so the tests
and the benchmark drive every step with bounded, valid answers. A real model needs no
constraint, and one would hide its own reading of the page."""

KIND_OF_TYPE: dict[str, str] = {
    "text": "text", "list_item": "text", "code": "text", "algorithm": "text",
    "index": "text", "phonetic": "text", "aside_text": "text", "page_footnote": "text",
    "table_footnote": "text", "image_footnote": "text", "footnote": "text",
    "code_caption": "text", "formula_number": "text",
    "title": "title", "doc_title": "title", "paragraph_title": "title",
    "table": "table", "table_caption": "table_caption",
    "image": "figure", "chart": "figure", "unknown": "figure",
    "image_caption": "figure_caption", "caption": "figure_caption",
    "equation": "equation", "ref_text": "reference",
    "header": "header", "footer": "footer", "page_number": "page_number",
}
"""MinerU's block types as region kinds (``layout.REGION_KINDS``); a type not listed reads as
text, so its content is kept."""
CONTAINER_TYPES = frozenset({"list", "equation_block", "image_block"})
"""Types that only group other blocks (MinerU extracts their members, never them)."""
PROMPT_OF_KIND = {"table": "table", "equation": "equation"}
"""The prompt a region kind is recognised with (the others: ``text``; figures: none)."""

REPETITION = {"max_pattern_size": 64, "min_pattern_size": 4, "min_count": 10}
"""vLLM's repetition detection (``RepetitionDetectionParams``): a run of 4 to 64 tokens
repeated 10 times ends the answer as a loop (an empty 3-column table row is 4 tokens)."""


class InvalidAnswer(RayorchError):
    """An answer failed validation; the message names the problem, never the answer."""


def region_kind_of(label: str) -> str | None:
    """The region kind of MinerU block type ``label``; ``None`` for a container."""
    if label in CONTAINER_TYPES:
        return None
    return KIND_OF_TYPE.get(label, "text")


def prompt_key(kind: str) -> str | None:
    """Which prompt recognises a region of ``kind``: ``None`` for a figure (kept as its crop).

    >>> prompt_key("table"), prompt_key("title"), prompt_key("figure")
    ('table', 'text', None)
    """
    return None if kind == "figure" else PROMPT_OF_KIND.get(kind, "text")


def require_mineru_vl_utils() -> None:
    """``OcrEngineError`` unless mineru-vl-utils is installed (said before any actor starts)."""
    import importlib.util

    if importlib.util.find_spec("mineru_vl_utils") is None:
        from rayorch.pipelines.document.ocr import OcrEngineError

        raise OcrEngineError("--ocr mineru needs mineru-vl-utils (MinerU's prompts and "
                             "parsers): pip install 'rayorch[model]' (vLLM's CPU build) or "
                             "'rayorch[gpu]'")


@functools.cache
def mineru_helper() -> Any:
    """mineru-vl-utils' model-free helper (layout parser, crop sizing, post-processing), with
    its logging off: it would print model output."""
    from loguru import logger
    from mineru_vl_utils.mineru_client import (
        DEFAULT_PROMPTS,
        DEFAULT_SAMPLING_PARAMS,
        MinerUClientHelper,
    )

    logger.disable("mineru_vl_utils")
    return MinerUClientHelper(
        backend="vllm-async-engine", prompts=DEFAULT_PROMPTS,
        sampling_params=DEFAULT_SAMPLING_PARAMS, layout_image_size=LAYOUT_IMAGE_SIZE,
        min_image_edge=28, max_image_edge_ratio=50, simple_post_process=False,
        handle_equation_block=True, abandon_list=False, abandon_paratext=False,
        image_analysis=False, debug=False)


def prompts_for(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The prompt of each request kind (:data:`PROMPT_KEYS`): mineru-vl-utils' own, with
    ``overrides`` (a user's model may want its own). An unknown key or a non-text prompt is
    an ``InvalidAnswer``'s sibling, a ``RayorchError`` naming it."""
    require_mineru_vl_utils()
    from mineru_vl_utils.mineru_client import DEFAULT_PROMPTS

    prompts = {key: DEFAULT_PROMPTS[name] for key, name in PROMPT_KEYS.items()}
    for key, prompt in (overrides or {}).items():
        if key not in PROMPT_KEYS:
            raise RayorchError(f"unknown MinerU prompt {key!r}: the prompts are "
                               f"{', '.join(PROMPT_KEYS)}")
        if not isinstance(prompt, str) or not prompt.strip():
            raise RayorchError(f"the MinerU prompt {key!r} is not a non-empty text")
        prompts[key] = prompt
    return prompts


def sampling_penalties(key: str) -> dict[str, float]:
    """mineru-vl-utils' penalties for request kind ``key`` (presence, frequency, repetition)."""
    from mineru_vl_utils.mineru_client import DEFAULT_SAMPLING_PARAMS

    params = DEFAULT_SAMPLING_PARAMS[PROMPT_KEYS[key]]
    return {name: float(getattr(params, name) or default) for name, default in
            (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
             ("repetition_penalty", 1.0))}


def sampling_ladder(temperature: float, retries: int) -> list[float]:
    """The temperature of each attempt: the first ``temperature``, each retry 0.4 higher
    (at most 1.2): another sampling setting, as olmOCR retries a page."""
    return [temperature] + [round(min(1.2, temperature + 0.4 * k), 3)
                            for k in range(1, retries + 1)]


def finish_problem(finish_reason: str | None, max_tokens: int | None) -> str | None:
    """Why an answer the engine ended with ``finish_reason`` is not one, or ``None``
    (``max_tokens``: the request's limit, ``None`` for the model's context).

    >>> finish_problem("length", 64)
    'hit the token limit (64 tokens)'
    """
    if finish_reason == "stop":
        return None
    if finish_reason == "length":
        limit = f"{max_tokens} tokens" if max_tokens else "the model's context"
        return f"hit the token limit ({limit})"
    if finish_reason == "repetition":
        return "a repetition loop"
    return f"the engine ended it ({str(finish_reason)[:20]})"


LayoutBox = tuple[str, tuple[float, float, float, float], int | None, str]
"""One layout block: its region kind, its box (fractions of the page), its rotation in
degrees (``None``: not said) and MinerU's type."""


def layout_boxes(text: str) -> list[LayoutBox]:
    """The blocks of a layout answer, in the model's reading order; ``InvalidAnswer`` when it
    has none this code can read (containers left out)."""
    blocks = mineru_helper().parse_layout_output(text)
    found: list[LayoutBox] = []
    for block in blocks:
        kind = region_kind_of(str(block.type))
        if kind is not None:
            x0, y0, x1, y1 = (float(v) for v in block.bbox)
            found.append((kind, (x0, y0, x1, y1), block.angle, str(block.type)))
    if not found:
        raise InvalidAnswer(f"unparsable layout: no box line in {len(text)} characters")
    return found


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean_answer(text: str) -> str:
    """A text or formula answer without special tokens, code fences or control characters.

    >>> clean_answer("a<|im_end|>b\x19c")
    'abc'
    """
    return _CONTROL.sub("", parse_vlm_output(text))


def _post_processed(kind: str, text: str) -> str:
    """``text`` after mineru-vl-utils' post-processing of one block of ``kind``."""
    from mineru_vl_utils.structs import ContentBlock

    [block] = mineru_helper().post_process([ContentBlock(kind, [0.0, 0.0, 1.0, 1.0],
                                                         content=text)]) or [None]
    return "" if block is None or block.content is None else str(block.content)


def table_html(text: str) -> str:
    """A table answer (OTSL) as HTML; ``InvalidAnswer`` when it is not a table."""
    html = _post_processed("table", text)
    if "<table" not in html or "<td" not in html:
        raise InvalidAnswer(f"unparsable table: no OTSL cell in {len(text)} characters")
    return html


def equation_latex(text: str) -> str:
    """A formula answer as LaTeX (mineru-vl-utils' repairs, without its ``\\[ \\]``, which the
    Markdown's ``$$`` replace); ``InvalidAnswer`` when empty."""
    latex = _post_processed("equation", clean_answer(text)).strip()
    latex = latex.removeprefix("\\[").removesuffix("\\]").strip()
    if not latex:
        raise InvalidAnswer("an empty formula")
    return latex


def block_text(kind: str, text: str) -> str:
    """A text answer after mineru-vl-utils' clean-up; a title on one line."""
    cleaned = _post_processed("text", clean_answer(text)).strip()
    return " ".join(cleaned.split()) if kind == "title" else cleaned


def read_answer(kind: str, text: str) -> dict[str, Any]:
    """A region's answer as its block's content field (``text``, ``table``, ``latex``)."""
    key = prompt_key(kind)
    if key == "table":
        return {"table": {"html": table_html(text)}}
    if key == "equation":
        return {"latex": equation_latex(text)}
    return {"text": block_text(kind, text)}


def fallback_for(region: Mapping[str, Any], kind: str) -> str:
    """What stands in for a region whose answers all failed, or that the layout step could
    not give (a whole-page region): ``text-layer`` (its usable words), ``crop-image`` (an
    equation, kept as its image), ``ocr-page`` or ``ocr-crop`` (RapidOCR).

    >>> fallback_for({"words": [], "fallback": "ocr-page"}, "text")
    'ocr-page'
    """
    if kind == "equation" and not region.get("fallback"):
        return "crop-image"
    if usable_words_text(region.get("words") or []) is not None:
        return "text-layer"
    return "ocr-page" if region.get("fallback") == "ocr-page" else "ocr-crop"


def layout_regions(page: Mapping[str, Any], boxes: Sequence[LayoutBox], image: Any
                   ) -> list[dict[str, Any]]:
    """The region items of a page's layout blocks, in the model's reading order: each crop
    cut from the full-resolution page ``image`` (PIL), the text-layer words inside it (when
    the page's layer is usable), its ``angle`` and MinerU's ``label``."""
    from rayorch.pipelines.document.layout import clamp_box, pixel_box, region_item

    words = (page.get("words") or []) if page.get("layer") == "usable" else []
    regions = []
    for order, (kind, box, angle, label) in enumerate(boxes):
        box = clamp_box(box)
        item = region_item(dict(page), order, kind, 1.0, box, image.crop(pixel_box(image, box)),
                           words)
        regions.append({**item, "angle": angle, "label": label})
    return regions


def request_image(region: Mapping[str, Any]) -> bytes:
    """The image a recognition request carries: the region's crop turned upright (its
    ``angle``) and sized as MinerU sizes crops (edges at least 28 px, at most 1:50), as PNG."""
    from rayorch.pipelines.document.layout import open_png, png_bytes

    image = open_png(region["crop"]).convert("RGB")
    if region.get("angle") in (90, 180, 270):
        image = image.rotate(int(region["angle"]), expand=True)
    return png_bytes(mineru_helper().resize_by_need(image))


def layout_image(png: bytes) -> bytes:
    """The image a layout request carries: the page resized to :data:`LAYOUT_IMAGE_SIZE`."""
    from rayorch.pipelines.document.layout import open_png, png_bytes

    return png_bytes(mineru_helper().prepare_for_layout(open_png(png)))


def words_text(words: Sequence[Sequence[Any]]) -> str:
    """The usable text of ``words`` (``""`` when they are not usable)."""
    return usable_words_text(words) or ""


__all__ = [
    "KIND_OF_TYPE", "LAYOUT_IMAGE_SIZE", "PROMPT_KEYS", "REPETITION", "SYSTEM_PROMPT",
    "TEST_REGEXES", "InvalidAnswer", "LayoutBox", "block_text", "clean_answer",
    "equation_latex", "fallback_for", "finish_problem", "layout_boxes", "layout_image",
    "layout_regions", "mineru_helper", "prompt_key", "prompts_for", "read_answer",
    "region_kind_of", "request_image", "require_mineru_vl_utils", "sampling_ladder",
    "sampling_penalties", "table_html", "words_text",
]
