"""The recognition step of ``--ocr layout``: each region item becomes one block.

:class:`RecogniseRegion` reads a region by its kind:

* text, title, captions, reference: the text-layer words inside the box when they are usable
  (:func:`rayorch.pipelines.document.pdf_markdown.text_layer_quality`), else RapidOCR of the crop
  (the project's engine, :class:`rayorch.pipelines.document.ocr.RapidOcrEngine`);
* table: on a born-digital page, the columns and rows its words' positions show
  (:mod:`rayorch.pipelines.document.text_table`), unless its rules (a table ruled on every
  row and column) show more rows or columns; the lines under it that do not fit its columns
  are its ``notes`` (the table dict's key), not rows. On a scan the same, from RapidOCR's
  lines cut into words at their ink's gaps
  (:func:`~rayorch.pipelines.document.table_structure.ink_words`; engine ``ocr-grid``), small
  raised (lowered) digits written as superscripts (subscripts):
  :func:`~rayorch.pipelines.document.scripts.mark_scripts`. Else
  its rules, or SLANet's structure (:mod:`rayorch.pipelines.document.table_structure`) filled
  with the words, or the OCR lines, that fall into each cell: a Markdown pipe table, or HTML
  when a cell spans. A structure that cannot be read falls back to the region's text (text layer, or
  OCR of the crop: ``fallback`` says which);
* figure: the crop, as the block's image;
* equation: the crop as an image (no LaTeX model ships inside a wheel);
* header, footer, page number: the pipeline drops them before this step; one that arrives
  anyway is an empty text block.

A region that cannot be read is a ``RecordFailure`` for that region only, with the cause.
Blocks are plain dicts (the region contract, docs/topics/PIPELINES.md): ``page``, ``order``,
``kind``, ``bbox``, ``engine``, ``fallback`` and one of ``text``, ``table``, ``latex``,
``image``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayorch import RecordFailure
from rayorch.pipelines.document.layout import DROPPED_KINDS, REGION_KINDS, open_png
from rayorch.pipelines.document.ocr import (
    OcrBox,
    RapidOcrEngine,
    corners_rect,
    join_in_reading_order,
)
from rayorch.pipelines.document.pdf_markdown import normalise_ligatures, text_layer_quality
from rayorch.pipelines.document.scripts import fold_width
from rayorch.pipelines.document.table_structure import (
    Cell,
    SlanetTableModel,
    TableStructureError,
    assign_texts,
    ink_words,
    parse_structure,
    ruled_grid,
    table_content,
)
from rayorch.pipelines.document.text_table import text_table

Block = dict[str, Any]
TEXT_KINDS = frozenset({"title", "text", "figure_caption", "table_caption", "reference"})
IMAGE_KINDS = frozenset({"figure", "equation"})
REGION_OCR_OPTIONS: dict[str, Any] = {"det_limit_type": "max"}
"""RapidOCR's detector scales an image down to its size limit, never up: its default scales
every image up until its short side is 736 px, which makes a one-line crop 20x larger."""
MAX_EMPTY_CELLS = 1 / 3
"""A SLANet structure that leaves more of its cells without text than this is refused (it
splits rows that are one, or invents rows): the region falls back to its text."""
LINE_INSET = 0.1
"""RapidOCR's line box reaches past its glyphs by about this share of its height, above and
below: taken off, the line is as tall as a text layer's words (the font's height)."""
OCR_MARGIN = 8
"""White pixels added around a crop before OCR: text touching the crop's edge is found too."""


def word_boxes(words: Sequence[Sequence[Any]], transform: Any = None) -> list[OcrBox]:
    """Text-layer words (``[x0, y0, x1, y1, text]``) as OCR boxes (four corners, text, 1.0),
    their corners mapped by ``transform(x, y)`` when given."""
    boxes: list[OcrBox] = []
    for x0, y0, x1, y1, text in (w[:5] for w in words):
        corners = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
        if transform is not None:
            corners = [transform(x, y) for x, y in corners]
        boxes.append((corners, normalise_ligatures(str(text)), 1.0))
    return boxes


def usable_words_text(words: Sequence[Sequence[Any]]) -> str | None:
    """The words' text in reading order, or ``None`` when there is none or it is garbage."""
    text = join_in_reading_order(word_boxes(words))
    return text if text_layer_quality(text) == "usable" else None


def crop_transform(region: dict[str, Any], crop_size: tuple[int, int]) -> Any:
    """A function mapping PDF points of the region's page to pixels of its crop, or ``None``
    when the region does not carry its page's size (``width_pt``, ``height_pt``)."""
    if not region.get("width_pt") or not region.get("height_pt"):
        return None
    x0, y0, x1, y1 = (float(v) for v in region["bbox"])
    width_pt, height_pt = float(region["width_pt"]), float(region["height_pt"])
    sx = crop_size[0] / max((x1 - x0) * width_pt, 1e-9)
    sy = crop_size[1] / max((y1 - y0) * height_pt, 1e-9)
    return lambda x, y: ((x - x0 * width_pt) * sx, (y - y0 * height_pt) * sy)


def _rect(box: OcrBox) -> tuple[float, float, float, float]:
    return corners_rect(box[0])


def region_problem(region: Any) -> str | None:
    """Why ``region`` is not a region item recognition can read, or ``None``."""
    if not isinstance(region, dict):
        return f"a region item is a dict, got {type(region).__name__}"
    missing = [k for k in ("page", "order", "kind", "bbox", "crop") if k not in region]
    if missing:
        return f"the region item lacks {', '.join(missing)}"
    if region["kind"] not in REGION_KINDS:
        return f"unknown region kind {region['kind']!r}"
    return None


class RecogniseRegion:
    """Per region item, its block (an actor module; batched over regions of many pages).

    RapidOCR and SLANet load once, in the constructor, from their wheels. ``ocr_options`` go
    to :class:`~rayorch.pipelines.document.ocr.RapidOcrEngine` (over :data:`REGION_OCR_OPTIONS`).
    """

    def __init__(self, *, ocr_options: dict[str, Any] | None = None) -> None:
        self.ocr = RapidOcrEngine(**{**REGION_OCR_OPTIONS, **(ocr_options or {})})
        self.tables = SlanetTableModel()

    def __call__(self, regions: list[dict[str, Any]]) -> list[Block | RecordFailure]:
        return [self._region(region) for region in regions]

    def _region(self, region: Any) -> Block | RecordFailure:
        where = (f"page {region.get('page', '?')} region {region.get('order', '?')}"
                 if isinstance(region, dict) else "a region")
        problem = region_problem(region)
        if problem is not None:
            return RecordFailure(f"recognise: {where}: {problem}")
        try:
            return self.recognise(region)
        except Exception as exc:  # this region only; its cause stays in the record
            return RecordFailure(
                f"recognise: {where} ({region['kind']}): {type(exc).__name__}: {exc}")

    def recognise(self, region: dict[str, Any]) -> Block:
        """The block of one (checked) region; raises what reading it raised."""
        kind = region["kind"]
        if kind in DROPPED_KINDS:
            return _block(region, "none", None, text="")
        if kind in IMAGE_KINDS:
            open_png(region["crop"])  # a crop that is no image fails here, not in the writer
            return _block(region, "crop", None, image=bytes(region["crop"]))
        if kind == "table":
            return self._table(region)
        text, engine = self._text(region)
        if kind == "title":
            text = " ".join(text.split())
        return _block(region, engine, None, text=text)

    def _text(self, region: dict[str, Any]) -> tuple[str, str]:
        """The region's text and what read it: its usable words, else OCR of its crop."""
        text = usable_words_text(region.get("words") or [])
        if text is not None:
            return text, "text-layer"
        return join_in_reading_order(self._ocr_boxes(open_png(region["crop"]))), "rapidocr"

    def _ocr_boxes(self, image: Any, scripts: bool = False) -> list[OcrBox]:
        """RapidOCR's boxes on a crop (PIL), in the crop's pixels; ``scripts``: raised
        (lowered) small digits as superscripts (subscripts)."""
        import numpy as np
        from PIL import ImageOps

        padded = ImageOps.expand(image.convert("L"), border=OCR_MARGIN, fill=255)
        boxes = self.ocr.boxes(np.asarray(padded), scripts=scripts)
        return [([(float(x) - OCR_MARGIN, float(y) - OCR_MARGIN) for x, y in points], text,
                 score) for points, text, score in boxes]

    def _table(self, region: dict[str, Any]) -> Block:
        import numpy as np

        image = open_png(region["crop"])
        boxes, engine = self._cell_boxes(region, image)
        grid = ruled_grid(np.asarray(image.convert("L")))
        # The words' own positions give the cells: a born-digital page's words, or a scan's
        # OCR lines cut into words at their ink's gaps.
        words = (region.get("words") or [] if engine == "text-layer"
                 else _scan_words(region, image, boxes))
        if words:
            try:
                rows, texts, notes = text_table(words)
                if grid is None or _finer(rows, grid[0]):
                    return _block(region, "text-grid" if engine == "text-layer" else "ocr-grid",
                                  None, table=_with_notes(table_content(rows, texts), notes))
            except TableStructureError:
                pass  # not columns the words show: the rules, or SLANet, read the crop
        if grid is not None:  # a table ruled on every row and column: its rules say it all
            rows, cells = grid
            inside = [box for box in boxes if _holds(cells, _rect(box))]
            outside = [box for box in boxes if not _holds(cells, _rect(box))]
            return _block(region, "ruled-grid", None, table=_with_notes(
                _filled(rows, cells, inside)[0], join_in_reading_order(outside)))
        try:
            tokens, cells = self.tables.structure(np.asarray(image.convert("RGB"))[:, :, ::-1])
            rows = parse_structure(tokens)
            if sum(len(row) for row in rows) != len(cells):
                raise TableStructureError(f"{len(cells)} cell boxes for "
                                          f"{sum(len(row) for row in rows)} cells")
            if len(rows) < 2 and len(rows[0]) < 2:
                raise TableStructureError("one cell is not a table")
            content, empty = _filled(rows, cells, boxes)
            if boxes and empty > MAX_EMPTY_CELLS:
                raise TableStructureError(f"{empty:.0%} of SLANet's cells hold no text")
        except TableStructureError:  # the region's text, read as any text region is
            fallback = "text-layer" if engine == "text-layer" else "ocr-crop"
            return _block(region, engine, fallback, text=join_in_reading_order(boxes))
        return _block(region, "slanet", None, table=content)

    def _cell_boxes(self, region: dict[str, Any], image: Any) -> tuple[list[OcrBox], str]:
        """The table's text boxes in crop pixels and what read them: its usable words, else
        RapidOCR's lines."""
        transform = crop_transform(region, image.size)
        words = region.get("words") or []
        if transform is not None and usable_words_text(words) is not None:
            return word_boxes(words, transform), "text-layer"
        return self._ocr_boxes(image, scripts=True), "rapidocr"


def _scan_words(region: dict[str, Any], image: Any, boxes: list[OcrBox]
                ) -> list[list[Any]]:
    """A scan's OCR lines as words ``[x0, y0, x1, y1, text]`` in PDF points (as a text layer's
    words are; none when the region does not carry its page's size): each line cut at its
    ink's gaps (:func:`~rayorch.pipelines.document.table_structure.ink_words`), its text
    NFKC-folded (the recogniser answers full-width commas and points) but for its
    superscripts and subscripts."""
    import numpy as np

    if not region.get("width_pt") or not boxes:
        return []
    left, _, right, _ = (float(v) for v in region["bbox"])
    scale = (right - left) * float(region["width_pt"]) / max(image.size[0], 1)
    lines = []
    for box in boxes:
        x0, y0, x1, y1 = _rect(box)
        inset = LINE_INSET * (y1 - y0)
        lines.append(((x0, y0 + inset, x1, y1 - inset), fold_width(box[1])))
    return [[a * scale, b * scale, c * scale, d * scale, text]
            for (a, b, c, d), text in ink_words(np.asarray(image.convert("L")), lines)]


def _holds(cells: Sequence[Sequence[float]], box: Sequence[float]) -> bool:
    """Whether the centre of ``box`` lies inside the cells' outline."""
    x, y = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    return (min(c[0] for c in cells) <= x <= max(c[2] for c in cells)
            and min(c[1] for c in cells) <= y <= max(c[3] for c in cells))


def _filled(rows: list[list[Cell]], cells: Sequence[Sequence[float]], boxes: list[OcrBox]
            ) -> tuple[dict[str, str], float]:
    """The table with each cell's text boxes joined in reading order, and the share of its
    cells that no text box falls into."""
    owned = assign_texts(cells, [_rect(box) for box in boxes])
    texts = [" ".join(join_in_reading_order([boxes[i] for i in mine]).split()) for mine in owned]
    return table_content(rows, texts), sum(1 for t in texts if not t) / max(len(texts), 1)


def _finer(words: list[list[Cell]], rules: list[list[Cell]]) -> bool:
    """Whether the words' grid has as many rows and columns as the rules' grid at least (a
    rule grid merges the header rows a spanning cell crosses; words set close together in
    a ruled table merge columns)."""
    def size(rows: list[list[Cell]]) -> tuple[int, int]:
        return len(rows), max(sum(span for span, _ in row) for row in rows)
    (rows_w, cols_w), (rows_r, cols_r) = size(words), size(rules)
    return rows_w >= rows_r and cols_w >= cols_r


def _with_notes(table: dict[str, str], notes: str) -> dict[str, str]:
    """The table with the text under it that is no part of it (its notes), when any."""
    notes = " ".join(notes.split())
    return {**table, "notes": notes} if notes else table


def _block(region: dict[str, Any], engine: str, fallback: str | None, **content: Any) -> Block:
    return {"page": region["page"], "order": region["order"], "kind": region["kind"],
            "bbox": list(region["bbox"]), "engine": engine, "fallback": fallback, **content}


__all__ = ["IMAGE_KINDS", "TEXT_KINDS", "RecogniseRegion", "region_problem",
           "usable_words_text", "word_boxes"]
