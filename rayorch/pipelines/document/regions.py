"""The region grain's actor modules around the models: which regions to recognise, and the
fallbacks that keep one bad page or region from failing its siblings.

* :class:`KeepRegions` splits a page's regions into those to recognise and the running
  page furniture (header, footer, page number: ``layout.DROPPED_KINDS``), which the
  pipeline drops with ``F.filter``: they stay children of their page, Dropped.
* :class:`LayoutOrFallback` runs a layout model; a page it cannot read becomes one text
  region covering the page (``fallback`` ``"text-layer"`` or ``"ocr-page"``).
* :class:`RecogniseOrFallback` runs a recogniser; a region it cannot read becomes a text
  block read by OCR of its crop (``fallback`` ``"ocr-crop"``), its cause kept in the block.

The models are plain classes passed in (``layout=``, ``recogniser=``), built once per
actor; values are the plain dicts of the region contract (docs/topics/PIPELINES.md, "The region
grain").

>>> KeepRegions()([[{"kind": "header"}, {"kind": "title"}]])
[([{'kind': 'header'}, {'kind': 'title'}], [False, True])]
"""

from __future__ import annotations

from typing import Any

from rayorch import RecordFailure
from rayorch.pipelines.document.layout import DROPPED_KINDS

Region = dict[str, Any]
Block = dict[str, Any]


def one_by_one_on_error(model: Any, items: list[Any], what: str) -> list[Any]:
    """``model(items)``; when the batch raises, each item alone, so one bad item fails alone
    (a ``RecordFailure`` with the exception's text), never its batch-mates."""
    try:
        return list(model(items))
    except Exception:  # which item broke it is unknown: ask each one
        out: list[Any] = []
        for item in items:
            try:
                out.extend(model([item]))
            except Exception as exc:
                out.append(RecordFailure(f"{what}: {type(exc).__name__}: {exc}"))
        return out


class KeepRegions:
    """Per page ``(regions, wanted)`` (``num_outputs=2``): ``wanted[i]`` is False for the
    running page furniture (:data:`DROPPED_KINDS`)."""

    def __call__(self, pages: list[list[Region]]) -> list[tuple[list[Region], list[bool]]]:
        return [(regions, [region.get("kind") not in DROPPED_KINDS for region in regions])
                for regions in pages]


def whole_page_region(page: dict[str, Any], cause: str) -> Region:
    """One text region covering ``page`` (its image and all its words), marked as the page's
    fallback with the cause of the failure it stands in for."""
    return {"page": page["page"], "order": 0, "kind": "text", "bbox": [0.0, 0.0, 1.0, 1.0],
            "score": 0.0, "crop": page["png"], "words": list(page.get("words") or []),
            "width_pt": page.get("width_pt"), "height_pt": page.get("height_pt"),
            "fallback": "ocr-page", "cause": cause}


class LayoutOrFallback:
    """``layout(**options)``'s regions per page; a page it fails becomes
    :func:`whole_page_region` (a page that is no page item still fails, alone)."""

    def __init__(self, layout: type, **options: Any) -> None:
        self.layout = layout(**options)

    def __call__(self, pages: list[dict[str, Any]]) -> list[list[Region] | RecordFailure]:
        out: list[list[Region] | RecordFailure] = []
        found = one_by_one_on_error(self.layout, pages, "layout")
        for page, regions in zip(pages, found, strict=True):
            if isinstance(regions, RecordFailure) and isinstance(page, dict) and "png" in page:
                out.append([whole_page_region(page, regions.cause)])
            else:
                out.append(regions)
        return out


class CropOcr:
    """RapidOCR of a region's crop, built at its first use: the text block standing in for a
    region a model could not read (``fallback``, ``cause`` the failure's text; empty text,
    with the reason added to the cause, when even OCR fails)."""

    def __init__(self) -> None:
        self._ocr: Any = None

    def block(self, region: Any, cause: str, *, fallback: str = "ocr-crop") -> Block:
        if not isinstance(region, dict):
            region = {}
        text = ""
        try:
            if self._ocr is None:
                from rayorch.pipelines.document.ocr import RapidOcrEngine
                from rayorch.pipelines.document.recognise import REGION_OCR_OPTIONS

                self._ocr = RapidOcrEngine(**REGION_OCR_OPTIONS)
            [text] = self._ocr.recognize([{"png": bytes(region["crop"])}])
        except Exception as exc:  # the block says why it is empty
            cause = f"{cause}; OCR of the crop: {type(exc).__name__}: {exc}"
        return {"page": region.get("page"), "order": region.get("order"),
                "kind": region.get("kind", "text"), "bbox": list(region.get("bbox") or []),
                "engine": "rapidocr", "fallback": fallback, "cause": cause, "text": text}


class RecogniseOrFallback:
    """``recogniser(**options)``'s block per region; a region it fails becomes a text block
    from OCR of the crop (``fallback="ocr-crop"``, ``cause`` the failure's text; empty text
    when even that fails). A region that was itself a fallback (:func:`whole_page_region`)
    passes its ``fallback`` and ``cause`` on to its block."""

    def __init__(self, recogniser: type, **options: Any) -> None:
        self.recogniser = recogniser(**options)
        self._crop_ocr = CropOcr()

    def __call__(self, regions: list[Region]) -> list[Block]:
        blocks: list[Block] = []
        found = one_by_one_on_error(self.recogniser, regions, "recognise")
        for region, block in zip(regions, found, strict=True):
            if isinstance(block, RecordFailure):
                blocks.append(self._crop_ocr.block(region, block.cause))
                continue
            if region.get("fallback") and not block.get("fallback"):
                used_layer = block.get("engine") == "text-layer"
                block = {**block, "fallback": "text-layer" if used_layer else region["fallback"],
                         "cause": region.get("cause")}
            blocks.append(block)
        return blocks


__all__ = ["CropOcr", "KeepRegions", "LayoutOrFallback", "RecogniseOrFallback",
           "one_by_one_on_error", "whole_page_region"]
