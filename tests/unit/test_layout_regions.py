"""The layout step's pure parts: label mapping, box merging, reading order, a page's regions.

No model runs here (tests/layout runs the real ones); a page's regions are built from given
detections on a drawn image.
"""

from __future__ import annotations

import io

import pytest

from rayorch.pipelines.document.layout import (
    CDLA_KINDS,
    REGION_KINDS,
    merge_detections,
    page_problem,
    page_regions,
    reading_order,
    region_kind,
    words_inside,
)

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402


def test_every_cdla_label_maps_to_a_region_kind_and_unknown_labels_keep_their_text() -> None:
    assert set(CDLA_KINDS) == {"text", "title", "figure", "figure_caption", "table",
                               "table_caption", "header", "footer", "reference", "equation"}
    assert all(region_kind(label) in REGION_KINDS for label in CDLA_KINDS)
    assert region_kind("table_caption") == "table_caption"
    assert region_kind("stamp") == "text"  # a label this code does not know is not dropped


def test_one_column_reads_top_to_bottom() -> None:
    boxes = [(0.1, 0.7, 0.9, 0.8), (0.1, 0.1, 0.9, 0.2), (0.1, 0.4, 0.9, 0.5)]
    assert reading_order(boxes) == [1, 2, 0]


def test_two_columns_under_a_wide_title_read_column_by_column() -> None:
    title = (0.1, 0.02, 0.9, 0.06)
    left = [(0.1, 0.1, 0.45, 0.3), (0.1, 0.32, 0.45, 0.6)]
    right = [(0.55, 0.1, 0.9, 0.3), (0.55, 0.32, 0.9, 0.6)]
    boxes = [right[1], left[1], title, right[0], left[0]]
    # The columns' paragraph gaps line up (0.3..0.32): still one column, then the other.
    assert reading_order(boxes) == [2, 4, 1, 3, 0]


def test_a_wide_table_ends_the_columns_above_it_and_starts_new_ones_below() -> None:
    boxes = [
        (0.1, 0.1, 0.45, 0.3),  # 0 left column, top section
        (0.55, 0.1, 0.9, 0.3),  # 1 right column, top section
        (0.1, 0.35, 0.9, 0.5),  # 2 a table across both columns
        (0.55, 0.55, 0.9, 0.8),  # 3 right column, bottom section
        (0.1, 0.55, 0.45, 0.8),  # 4 left column, bottom section
    ]
    assert reading_order(boxes) == [0, 1, 2, 4, 3]


def test_boxes_a_hair_too_wide_still_leave_the_gutter_between_columns() -> None:
    # A model's boxes may overlap the gutter by a pixel or two (0.002 of the page).
    boxes = [(0.1, 0.2, 0.501, 0.5), (0.499, 0.1, 0.9, 0.3), (0.499, 0.32, 0.9, 0.5)]
    assert reading_order(boxes) == [0, 1, 2]


def test_overlapping_boxes_without_gaps_read_by_their_top_edge() -> None:
    boxes = [(0.2, 0.3, 0.8, 0.6), (0.1, 0.2, 0.7, 0.5)]
    assert reading_order(boxes) == [1, 0]


def test_same_kind_duplicates_merge_into_one_box_covering_both() -> None:
    merged = merge_detections([("text", 0.9, (0.1, 0.1, 0.5, 0.3)),
                               ("text", 0.7, (0.1, 0.12, 0.5, 0.33))])
    assert merged == [("text", 0.9, (0.1, 0.1, 0.5, 0.33))]


def test_a_text_box_inside_a_table_is_part_of_the_table() -> None:
    table = ("table", 0.95, (0.1, 0.3, 0.9, 0.6))
    cell_text = ("text", 0.6, (0.15, 0.35, 0.4, 0.4))
    assert merge_detections([cell_text, table]) == [table]


def test_a_larger_lower_scored_box_around_another_kind_is_kept() -> None:
    figure = ("figure", 0.9, (0.3, 0.3, 0.6, 0.5))
    around = ("text", 0.5, (0.1, 0.1, 0.9, 0.9))
    assert merge_detections([figure, around]) == [figure, around]


def test_boxes_that_barely_touch_stay_apart_and_empty_boxes_are_dropped() -> None:
    a = ("text", 0.9, (0.1, 0.1, 0.5, 0.3))
    b = ("text", 0.8, (0.1, 0.29, 0.5, 0.5))
    assert merge_detections([a, b, ("title", 0.99, (0.2, 0.2, 0.2, 0.4))]) == [a, b]


def test_words_inside_a_box_are_those_whose_centre_lies_in_it() -> None:
    words = [[10, 10, 20, 20, "in"], [28, 10, 40, 20, "half-out"], [10, 50, 20, 60, "below"]]
    assert [w[4] for w in words_inside(words, (0, 0, 30, 30))] == ["in"]


def _page(layer: str = "usable") -> dict[str, object]:
    image = Image.new("L", (200, 400), 255)
    image.paste(0, (20, 40, 180, 80))  # something dark where the title is
    out = io.BytesIO()
    image.save(out, format="PNG")
    return {"page": 3, "png": out.getvalue(), "width_pt": 100.0, "height_pt": 200.0,
            "dpi": 144, "words": [[12, 22, 40, 38, "Title"], [12, 110, 40, 120, "Body"]],
            "layer": layer}


def test_a_pages_regions_carry_order_crop_and_the_words_in_points() -> None:
    page = _page()
    image = Image.open(io.BytesIO(page["png"]))  # type: ignore[arg-type]
    detections = [("text", 0.8, (0.1, 0.5, 0.9, 0.65)), ("title", 0.9, (0.1, 0.1, 0.9, 0.2))]
    regions = page_regions(page, detections, image)
    assert [(r["order"], r["kind"], r["page"]) for r in regions] == [(0, "title", 3),
                                                                     (1, "text", 3)]
    title = regions[0]
    assert title["bbox"] == [0.1, 0.1, 0.9, 0.2] and title["score"] == 0.9
    assert [w[4] for w in title["words"]] == ["Title"]
    assert [w[4] for w in regions[1]["words"]] == ["Body"]
    crop = Image.open(io.BytesIO(title["crop"]))
    assert crop.size == (160, 40)  # cut from the full-resolution page, not the model's input
    assert crop.getpixel((10, 10)) == 0  # the dark band
    assert (title["width_pt"], title["height_pt"]) == (100.0, 200.0)


def test_a_page_without_detections_is_one_text_region_covering_it() -> None:
    page = _page()
    regions = page_regions(page, [], Image.open(io.BytesIO(page["png"])))  # type: ignore[arg-type]
    assert [(r["kind"], r["bbox"]) for r in regions] == [("text", [0.0, 0.0, 1.0, 1.0])]
    assert [w[4] for w in regions[0]["words"]] == ["Title", "Body"]


def test_words_of_a_garbage_text_layer_do_not_travel_with_the_regions() -> None:
    page = _page(layer="garbage")
    regions = page_regions(page, [], Image.open(io.BytesIO(page["png"])))  # type: ignore[arg-type]
    assert regions[0]["words"] == []


@pytest.mark.parametrize(("page", "why"), [
    ("not a dict", "a page item is a dict"),
    ({"page": 1, "png": b""}, "lacks width_pt, height_pt"),
    ({"page": 1, "png": b"", "width_pt": 0, "height_pt": 10}, "not positive"),
    ({"page": 1, "png": b"", "width_pt": "wide", "height_pt": 10}, "not a number"),
])
def test_a_page_item_that_cannot_be_read_says_why(page: object, why: str) -> None:
    problem = page_problem(page)
    assert problem is not None and why in problem
    assert page_problem(_page()) is None


def test_words_the_model_missed_become_a_text_region_of_their_own() -> None:
    page = _page()
    image = Image.open(io.BytesIO(page["png"]))  # type: ignore[arg-type]
    regions = page_regions(page, [("title", 0.9, (0.1, 0.1, 0.9, 0.2))], image)
    assert [(r["kind"], [w[4] for w in r["words"]]) for r in regions] == [
        ("title", ["Title"]), ("text", ["Body"])]
    assert regions[1]["score"] == 0.0
    assert regions[1]["bbox"] == [0.12, 0.55, 0.4, 0.6]  # the word's own box, in page fractions


def test_a_ruled_grid_the_model_calls_an_equation_is_a_table() -> None:
    from PIL import ImageDraw

    image = Image.new("L", (400, 400), 255)
    draw = ImageDraw.Draw(image)
    for r in range(6):  # a 5 x 3 ruled grid at (50..230, 100..220)
        draw.line((50, 100 + r * 24, 230, 100 + r * 24), fill=0)
    for c in range(4):
        draw.line((50 + c * 60, 100, 50 + c * 60, 220), fill=0)
    draw.text((60, 300), "x = y + 1", fill=0)
    page = {**_page(), "png": b"", "words": []}
    regions = page_regions(page, [("equation", 0.8, (0.1, 0.24, 0.6, 0.56)),
                                  ("equation", 0.8, (0.1, 0.72, 0.4, 0.8))], image)
    assert [r["kind"] for r in regions] == ["table", "equation"]


def _scan(blocks: list[tuple[int, int, int, int]]) -> Image.Image:
    """A page image (200 x 400 px) with black bars where text lines are."""
    from PIL import ImageDraw

    image = Image.new("L", (200, 400), 255)
    draw = ImageDraw.Draw(image)
    for box in blocks:
        draw.rectangle(box, fill=0)
    return image


BODY_LINES = [(20, y, 180, y + 5) for y in range(100, 160, 8)]  # a paragraph: 8 lines, 6 px


def test_ink_the_model_missed_on_a_scan_becomes_regions_read_as_text_or_heading() -> None:
    missed = [(20, 200, 180, 205), (20, 208, 180, 213), (20, 300, 120, 308)]
    image = _scan(BODY_LINES + missed)  # a missed 2-line paragraph, a missed taller line
    page = {**_page(layer="none"), "words": []}
    regions = page_regions(page, [("text", 0.9, (0.1, 0.24, 0.9, 0.41))], image)
    assert [(r["kind"], r["score"]) for r in regions] == [
        ("text", 0.9), ("text", 0.0), ("title", 0.0)]
    x0, y0, x1, y1 = regions[1]["bbox"]
    assert x0 <= 0.1 and x1 >= 0.9 and y0 <= 0.5 and y1 >= 213 / 400  # both missed lines


def test_a_speck_is_no_region_and_ink_beside_a_region_widens_it() -> None:
    image = _scan([*BODY_LINES, (2, 380, 4, 382), (182, 100, 195, 105)])
    page = {**_page(layer="none"), "words": []}
    regions = page_regions(page, [("text", 0.9, (0.1, 0.24, 0.9, 0.41))], image)
    assert len(regions) == 1
    assert regions[0]["bbox"][2] >= 195 / 200  # the word the model's box cut off


def test_missed_words_on_one_larger_line_are_a_heading() -> None:
    page = {**_page(), "words": [[12, 110, 30, 118, "body"], [32, 110, 50, 118, "text"],
                                 [12, 122, 30, 130, "more"], [12, 160, 60, 174, "Heading"]]}
    image = Image.open(io.BytesIO(page["png"]))  # type: ignore[arg-type]
    regions = page_regions(page, [("text", 0.9, (0.1, 0.5, 0.6, 0.7))], image)
    assert [(r["kind"], [w[4] for w in r["words"]]) for r in regions] == [
        ("text", ["body", "text", "more"]), ("title", ["Heading"])]
