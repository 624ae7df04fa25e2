"""``--ocr mineru`` without a model: reading MinerU's answers (box lines, OTSL, LaTeX, text),
checking them, the retry ladder, the fallback of each region, and the two steps' policy on
scripted answers (:class:`MineruSteps` over a fake ``ask``). The real engine runs in
``tests/model/test_mineru.py``.
"""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

pytest.importorskip("mineru_vl_utils")
PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from rayorch import RecordFailure  # noqa: E402
from rayorch.pipelines.document.layout import REGION_KINDS  # noqa: E402
from rayorch.pipelines.document.mineru import MineruSteps, RequestLog  # noqa: E402
from rayorch.pipelines.document.mineru_blocks import (  # noqa: E402
    KIND_OF_TYPE,
    InvalidAnswer,
    block_text,
    equation_latex,
    fallback_for,
    finish_problem,
    layout_boxes,
    layout_regions,
    prompts_for,
    sampling_ladder,
    table_html,
)

SECRET = "do-not-print-me"
"""Model output is untrusted: no message may carry it."""


def line(x0: int, y0: int, x1: int, y1: int, kind: str, rotate: str = "up") -> str:
    return (f"<|box_start|>{x0} {y0} {x1} {y1}<|box_end|><|ref_start|>{kind}<|ref_end|>"
            f"<|rotate_{rotate}|>\n")


def test_box_lines_become_region_kinds_in_the_models_reading_order() -> None:
    answer = (line(100, 50, 900, 90, "doc_title") + line(100, 100, 900, 400, "list")
              + line(100, 420, 900, 700, "table", "right") + line(100, 720, 900, 760, "chart"))
    assert layout_boxes(answer) == [
        ("title", (0.1, 0.05, 0.9, 0.09), 0, "doc_title"),  # the list container is left out
        ("table", (0.1, 0.42, 0.9, 0.7), 90, "table"),
        ("figure", (0.1, 0.72, 0.9, 0.76), 0, "chart")]
    assert all(kind in REGION_KINDS for kind in KIND_OF_TYPE.values())


@pytest.mark.parametrize("answer", [SECRET, "", line(5, 5, 5, 9, "text") + SECRET,
                                    line(1, 2, 3, 4, "list")])
def test_a_layout_without_a_readable_box_line_is_invalid_and_never_quoted(answer: str) -> None:
    with pytest.raises(InvalidAnswer, match="unparsable layout") as raised:
        layout_boxes(answer)
    assert SECRET not in str(raised.value)


def test_otsl_becomes_html_and_text_that_is_no_table_is_invalid() -> None:
    assert table_html("<fcel>a<lcel><nl><fcel>b<ecel><nl>") == (
        '<table><tr><td colspan="2">a</td></tr><tr><td>b</td><td></td></tr></table>')
    with pytest.raises(InvalidAnswer, match="unparsable table") as raised:
        table_html(SECRET)
    assert SECRET not in str(raised.value)


def test_formulas_lose_minerus_brackets_and_texts_their_special_tokens() -> None:
    assert equation_latex("\\[ x^{2} \\]<|im_end|>") == "x^{2}"
    with pytest.raises(InvalidAnswer, match="empty formula"):
        equation_latex("<|im_end|>  ")
    assert block_text("text", "two\x19 words<|box_end|>") == "two words"
    assert block_text("title", " A\n title ") == "A title"


def test_the_engines_finish_reasons_that_fail_an_answer() -> None:
    assert finish_problem("stop", 10) is None
    assert finish_problem("length", 10) == "hit the token limit (10 tokens)"
    assert finish_problem("length", None) == "hit the token limit (the model's context)"
    assert finish_problem("repetition", 10) == "a repetition loop"
    assert finish_problem("abort", 10) == "the engine ended it (abort)"


def test_each_retry_samples_hotter() -> None:
    assert sampling_ladder(0.0, 0) == [0.0]
    assert sampling_ladder(0.0, 2) == [0.0, 0.4, 0.8]
    assert sampling_ladder(1.0, 1) == [1.0, 1.2]


WORDS = [[72.0, 72.0, 140.0, 84.0, "Usable"], [145.0, 72.0, 200.0, 84.0, "words"]]


def test_the_fallback_of_a_region_is_its_text_layer_else_ocr_and_an_equation_its_image() -> None:
    assert fallback_for({"words": WORDS}, "text") == "text-layer"
    assert fallback_for({"words": WORDS}, "table") == "text-layer"
    assert fallback_for({"words": []}, "text") == "ocr-crop"
    assert fallback_for({"words": WORDS}, "equation") == "crop-image"
    assert fallback_for({"words": [], "fallback": "ocr-page"}, "text") == "ocr-page"
    assert fallback_for({"words": WORDS, "fallback": "ocr-page"}, "text") == "text-layer"


def test_prompts_default_to_minerus_and_unknown_ones_are_refused() -> None:
    prompts = prompts_for({"table": "Table, please:"})
    assert prompts["layout"] == "\nLayout Detection:" and prompts["table"] == "Table, please:"
    with pytest.raises(Exception, match="unknown MinerU prompt 'chart'"):
        prompts_for({"chart": "x"})


def page_item(number: int = 1, words: list[list[Any]] | None = None) -> dict[str, Any]:
    """A 612x792 pt page at 72 dpi: black bars on white, words in the top band."""
    image = Image.new("RGB", (612, 792), "white")
    for top in (72, 200, 400):
        image.paste((0, 0, 0), (72, top, 540, top + 12))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return {"page": number, "png": out.getvalue(), "width_pt": 612.0, "height_pt": 792.0,
            "dpi": 72, "words": WORDS if words is None else words, "layer": "usable"}


def test_layout_blocks_become_region_items_cut_from_the_full_page() -> None:
    page = page_item()
    image = Image.open(io.BytesIO(page["png"]))
    first, second = layout_regions(page, [("text", (0.1, 0.08, 0.9, 0.12), 0, "text"),
                                          ("table", (0.1, 0.2, 0.9, 0.6), 90, "table")], image)
    assert (first["order"], first["kind"], second["order"], second["angle"]) == (0, "text", 1, 90)
    assert Image.open(io.BytesIO(first["crop"])).size == (490, 32)  # pixels of the full page
    assert [w[4] for w in first["words"]] == ["Usable", "words"] and second["words"] == []


class Scripted:
    """A fake engine: answers per ``(key, attempt)``, or per key for every attempt; logs asks."""

    def __init__(self, answers: dict[Any, tuple[str, str]]) -> None:
        self.answers = answers
        self.asked: list[tuple[str, float, str, int]] = []

    async def __call__(self, key: str, png: bytes, temperature: float, tag: str,
                       attempt: int) -> tuple[str, str | None]:
        assert png.startswith(b"\x89PNG")
        self.asked.append((key, temperature, tag, attempt))
        found = self.answers.get((key, attempt), self.answers.get(key))
        if found is None:
            raise RuntimeError("the engine is gone")
        return found


def run(steps: MineruSteps, items: list[Any], step: str) -> list[Any]:
    return asyncio.run(steps(items, step=step))


def test_an_invalid_layout_is_asked_again_hotter_and_a_valid_retry_is_kept() -> None:
    ask = Scripted({("layout", 1): (SECRET, "stop"),
                    ("layout", 2): (line(100, 50, 900, 90, "title"), "stop")})
    [regions] = run(MineruSteps(ask, retries=1), [page_item()], "layout")
    assert [(r["kind"], r["order"]) for r in regions] == [("title", 0)]
    assert [(key, t, attempt) for key, t, _, attempt in ask.asked] == [
        ("layout", 0.0, 1), ("layout", 0.4, 2)]


def test_a_layout_that_never_passes_becomes_the_whole_page_with_each_tries_cause() -> None:
    ask = Scripted({("layout", 1): (SECRET, "length"), ("layout", 2): (SECRET, "stop")})
    [[region]] = run(MineruSteps(ask, max_tokens=8, retries=1), [page_item(3)], "layout")
    assert region["fallback"] == "ocr-page" and region["bbox"] == [0.0, 0.0, 1.0, 1.0]
    assert region["cause"] == ("layout: page 3: try 1 at temperature 0: hit the token limit "
                               "(8 tokens); try 2 at temperature 0.4: unparsable layout: no box "
                               f"line in {len(SECRET)} characters")
    [block] = run(MineruSteps(ask), [region], "recognise")  # no request: its text layer
    assert (block["fallback"], block["text"], block["cause"]) == (
        "text-layer", "Usable words", region["cause"])
    assert len(ask.asked) == 2


def test_regions_are_read_by_kind_and_one_that_fails_never_fails_its_siblings() -> None:
    page = page_item()
    image = Image.open(io.BytesIO(page["png"]))
    boxes = [("text", (0.1, 0.08, 0.9, 0.12), 0, "text"), ("table", (0.1, 0.2, 0.9, 0.6), 0,
                                                          "table"),
             ("equation", (0.1, 0.45, 0.9, 0.55), 0, "equation"),
             ("figure", (0.1, 0.6, 0.5, 0.9), 0, "image"),
             ("text", (0.1, 0.6, 0.9, 0.9), 0, "text")]
    regions = layout_regions(page, boxes, image)
    regions[4]["words"] = WORDS  # the last text region's answers loop: its words stand in
    ask = Scripted({"text": ("Read text", "stop"), ("table", 1): (SECRET, "stop"),
                    ("table", 2): ("<fcel>a<fcel>b<nl>", "stop"),
                    "equation": ("x", "repetition")})

    async def ask_per_region(key: str, png: bytes, t: float, tag: str, n: int
                             ) -> tuple[str, str | None]:
        if tag.endswith("region 4"):
            return SECRET, "repetition"
        return await ask(key, png, t, tag, n)

    text, table, equation, figure, looped = run(MineruSteps(ask_per_region), regions,
                                                "recognise")
    assert (text["text"], text["engine"], text["fallback"]) == ("Read text", "mineru", None)
    assert table["table"] == {"html": "<table><tr><td>a</td><td>b</td></tr></table>"}
    assert table["attempts"] == 2 and "cause" not in table
    assert equation["fallback"] == "crop-image" and equation["image"] == regions[2]["crop"]
    assert "try 2 at temperature 0.4: a repetition loop" in equation["cause"]
    assert figure["image"] == regions[3]["crop"] and figure["engine"] == "crop"
    assert (looped["fallback"], looped["text"]) == ("text-layer", "Usable words")
    assert all(SECRET not in str(block) for block in (text, table, equation, looped))


def test_an_answer_that_breaks_the_reader_is_invalid_and_its_siblings_stay() -> None:
    regions = layout_regions(page_item(), [("text", (0.1, 0.08, 0.9, 0.12), 0, "text"),
                                           ("text", (0.1, 0.2, 0.9, 0.3), 0, "text")],
                             Image.open(io.BytesIO(page_item()["png"])))
    regions[1]["words"] = WORDS

    async def ask(key: str, png: bytes, t: float, tag: str, n: int) -> tuple[Any, str]:
        return (None if tag.endswith("region 1") else "fine"), "stop"  # None: no text at all

    fine, broken = run(MineruSteps(ask), regions, "recognise")
    assert fine["text"] == "fine" and broken["fallback"] == "text-layer"
    assert broken["cause"].endswith("try 2 at temperature 0.4: an unreadable answer (TypeError)")


def test_a_page_the_step_itself_breaks_on_becomes_its_whole_page_region() -> None:
    async def ask(key: str, png: bytes, t: float, tag: str, n: int) -> tuple[str, str]:
        return line(100, 100, 900, 300, "text"), "stop"

    page = page_item(words=[["a word without its box"]])  # a renderer's bug, say
    [[region]] = run(MineruSteps(ask), [page], "layout")
    assert region["fallback"] == "ocr-page" and region["cause"].startswith("layout: IndexError")


def test_an_input_that_is_no_page_fails_alone_and_an_engine_error_is_not_retried() -> None:
    ask = Scripted({})  # every request raises
    bad, [region] = run(MineruSteps(ask, retries=2), [{"page": 2}, page_item(1)], "layout")
    assert isinstance(bad, RecordFailure) and "lacks png" in bad.cause
    assert region["cause"] == ("layout: page 1: try 1: the engine failed: "
                               "RuntimeError: the engine is gone")
    assert len(ask.asked) == 1
    with pytest.raises(Exception, match="unknown MinerU step 'ocr'"):
        run(MineruSteps(ask), [], "ocr")


@pytest.mark.parametrize("options, problem", [
    ({"max_tokens": 0}, "max_tokens must be a positive"),
    ({"temperature": float("nan")}, "temperature must be a number >= 0"),
    ({"temperature": -0.5}, "temperature must be a number >= 0"),
    ({"retries": -1}, "retries must be >= 0")])
def test_sampling_options_are_checked_before_any_model_loads(options: dict[str, Any],
                                                              problem: str) -> None:
    with pytest.raises(Exception, match=problem):
        MineruSteps(Scripted({}), **options)


def test_the_request_log_counts_requests_of_one_step_entering_while_the_other_runs() -> None:
    log = RequestLog()
    log.enter("layout")
    log.enter("layout")
    log.enter("recognise")  # a layout is inside: mixed
    log.leave("layout", {"step": "layout"})
    log.leave("layout", {"step": "layout"})
    log.enter("recognise")  # only recognition inside: not mixed
    assert log.stats() == {"requests": {"layout": 2, "recognise": 2}, "peak": 3, "mixed": 1}
