"""Assemble the region grain: blocks -> page Markdown and content list -> one document.

Pure functions (no I/O) and the two assemble modules of ``--ocr layout``:

* :class:`AssemblePage` gets one page's blocks (the ``F.reduce`` of its regions) and orders
  them: titles become headings, tables pipe tables or HTML, figures (and equations without
  LaTeX) image references ``figures/<stem>-p<page>-<order>.png``, equations ``$$latex$$``.
* :class:`AssembleRegionDocument` joins a document's pages, its content list (MinerU's
  shape), its figure files, and applies the fallback budget: a document whose share of
  fallback blocks passes ``max_fallback_share`` fails with that cause.

>>> blocks = [{"page": 1, "order": 1, "kind": "text", "bbox": [0.1, 0.2, 0.9, 0.3],
...            "engine": "text-layer", "fallback": None, "text": "Body."},
...           {"page": 1, "order": 0, "kind": "title", "bbox": [0.1, 0.05, 0.9, 0.1],
...            "engine": "text-layer", "fallback": None, "text": "Intro"}]
>>> page = assemble_page(blocks, 1, "doc-1a2b3c4d")
>>> page["markdown"]
'# Intro\\n\\nBody.'
>>> [entry["type"] for entry in page["content"]]
['title', 'text']
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rayorch import RayorchError, RecordFailure
from rayorch.pipelines.document.region_render import RegionMeta

Block = dict[str, Any]
PageResult = dict[str, Any]
"""``{"page", "markdown", "content", "figures", "blocks", "fallbacks", "causes", "titled"}``:
one page assembled (``figures``: name -> PNG bytes; ``fallbacks``: fallback -> count)."""

CONTENT_FIELDS = ("text", "table", "latex", "image")
"""A block's content fields: exactly one is present (the region contract)."""
GRID = 1000
"""Content-list boxes are integers on a 0..1000 grid of the page (MinerU's)."""


def figure_name(stem: str, page: int, order: int) -> str:
    """The file a block's image is written to, relative to the Markdown beside it."""
    return f"figures/{stem}-p{page}-{order}.png"


def block_problem(block: Any) -> str | None:
    """Why ``block`` is not a block the assembler can place, or ``None``."""
    if not isinstance(block, dict):
        return f"a block is a dict, got {type(block).__name__}"
    missing = [k for k in ("page", "order", "kind", "bbox") if k not in block]
    if missing:
        return f"the block lacks {', '.join(missing)}"
    fields = [f for f in CONTENT_FIELDS if f in block]
    if len(fields) != 1:
        return f"a block has one content field of {', '.join(CONTENT_FIELDS)}, not {fields}"
    return None


def grid_box(bbox: Any) -> list[int]:
    """A 0..1 box as integers on the content list's 0..1000 grid (clamped).

    >>> grid_box([0.1, 0.25, 0.5004, 1.2])
    [100, 250, 500, 1000]
    """
    return [min(GRID, max(0, round(float(v) * GRID))) for v in list(bbox)[:4]]


def table_body(table: dict[str, Any]) -> str:
    """A table block's Markdown or HTML."""
    return str(table.get("markdown") or table.get("html") or "")


def block_markdown(block: Block, figure: str | None, heading: str) -> str:
    """One block as Markdown (``""`` when it holds nothing); ``heading`` prefixes a title."""
    if "table" in block:
        notes = str(block["table"].get("notes") or "").strip()
        return table_body(block["table"]).strip() + (f"\n\n{notes}" if notes else "")
    if "latex" in block:
        latex = str(block["latex"]).strip()
        return f"$$\n{latex}\n$$" if latex else ""
    if "image" in block:
        return f"![]({figure})" if figure else ""
    text = str(block.get("text") or "").strip()
    if block["kind"] == "title" and text:
        return f"{heading} {' '.join(text.split())}"
    return text


def content_entry(block: Block, figure: str | None, page: int) -> dict[str, Any] | None:
    """The block's entry in the content list (MinerU's shape), or ``None`` when empty. A
    block that fell back says so: ``fallback`` (how it was read) and ``region_kind`` (what
    the layout found), so a table read as plain text is not taken for a paragraph."""
    entry: dict[str, Any]
    if "table" in block:
        entry = {"type": "table", "table_body": table_body(block["table"])}
        if block["table"].get("notes"):  # the text under the table, no part of it
            entry["table_footnote"] = [str(block["table"]["notes"])]
    elif "latex" in block:
        entry = {"type": "equation", "latex": str(block["latex"])}
    elif "image" in block:
        entry = {"type": "equation" if block["kind"] == "equation" else "image",
                 "img_path": figure}
    else:
        text = str(block.get("text") or "").strip()
        if not text:
            return None
        entry = ({"type": "title", "text": " ".join(text.split()), "text_level": 1}
                 if block["kind"] == "title" else {"type": "text", "text": text})
    entry["bbox"] = grid_box(block["bbox"])
    entry["page_idx"] = page - 1
    entry["order"] = int(block["order"])  # its region: entity (source, page_idx, order)
    if block.get("fallback"):  # read another way than its kind asks (a table as its text)
        entry["fallback"] = str(block["fallback"])
        entry["region_kind"] = str(block["kind"])
    return entry


def assemble_page(blocks: list[Block], page: int, stem: str) -> PageResult:
    """One page from its blocks, in reading order (``order``). A block that is not one raises
    ``ValueError``. On page 1 a first title is the document's ``#`` heading (``titled``)."""
    for block in blocks:
        problem = block_problem(block)
        if problem is not None:
            raise ValueError(problem)
    ordered = sorted(blocks, key=lambda b: int(b["order"]))
    parts: list[str] = []
    content: list[dict[str, Any]] = []
    figures: dict[str, bytes] = {}
    titled = page == 1 and bool(ordered) and ordered[0]["kind"] == "title" \
        and "text" in ordered[0] and bool(str(ordered[0]["text"]).strip())
    for i, block in enumerate(ordered):
        figure = None
        if "image" in block:
            figure = figure_name(stem, page, int(block["order"]))
            figures[figure] = bytes(block["image"])
        heading = "#" if titled and i == 0 else "##"
        markdown = block_markdown(block, figure, heading)
        if markdown:
            parts.append(markdown)
        entry = content_entry(block, figure, page)
        if entry is not None:
            content.append(entry)
    fallbacks = Counter(str(b["fallback"]) for b in ordered if b.get("fallback"))
    causes = [f"page {page} region {b['order']}: {b['cause']}" for b in ordered
              if b.get("fallback") and b.get("cause")]
    return {"page": page, "markdown": "\n\n".join(parts), "content": content,
            "figures": figures, "blocks": len(ordered), "fallbacks": dict(fallbacks),
            "causes": causes, "titled": titled}


def check_fallback_share(share: float) -> None:
    """Refuse a fallback budget that is not a share from 0 to 1 (``RayorchError``)."""
    if not 0.0 <= share <= 1.0:
        raise RayorchError(f"max_fallback_share is a share from 0 to 1, not {share}")


def fallback_budget_problem(pages: list[PageResult], max_share: float) -> str | None:
    """Why a document's fallback blocks are too many (more than ``max_share`` of its
    blocks), naming the first causes; ``None`` when within the budget."""
    blocks = sum(int(p["blocks"]) for p in pages)
    fell_back: Counter[str] = Counter()
    for page in pages:
        fell_back.update(page["fallbacks"])
    count = sum(fell_back.values())
    if not blocks or count / blocks <= max_share:
        return None
    kinds = ", ".join(f"{n} {what}" for what, n in sorted(fell_back.items()))
    causes = [c for page in pages for c in page["causes"]][:3]
    return (f"fallback budget: {count} of {blocks} blocks fell back ({kinds}), "
            f"a share of {count / blocks:.2f} > --max-fallback-share {max_share:g}"
            + (f"; {'; '.join(causes)}" if causes else ""))


def document_markdown(pages: list[PageResult], meta: RegionMeta, *,
                      page_markers: bool = True, engine: str = "layout") -> str:
    """The document: its title (unless page 1 opens with one), then each page after
    ``<!-- page N engine=E -->`` (``engine``: ``layout`` or ``mineru``; without those markers
    when ``page_markers`` is False)."""
    parts = [] if pages and pages[0]["page"] == 1 and pages[0]["titled"] \
        else [f"# {meta['title']}"]
    parts.append(f"<!-- source: {meta['path']} -->")
    for page in pages:
        if page_markers:
            parts.append(f"<!-- page {page['page']} engine={engine} -->")
        if page["markdown"]:
            parts.append(page["markdown"])
    return "\n\n".join(parts) + "\n"


class AssemblePage:
    """Per page, its blocks (in any order), its number and its document's meta (broadcast)
    -> a :data:`PageResult`; a malformed block fails that page, with the cause."""

    def __call__(self, blocks: list[list[Block]], numbers: list[int],
                 metas: list[RegionMeta]) -> list[PageResult | RecordFailure]:
        out: list[PageResult | RecordFailure] = []
        for page_blocks, number, meta in zip(blocks, numbers, metas, strict=True):
            try:
                out.append(assemble_page(page_blocks, int(number), str(meta["figure_stem"])))
            except (ValueError, TypeError, KeyError) as exc:
                out.append(RecordFailure(f"assemble page {number}: {exc}"))
        return out


class AssembleRegionDocument:
    """A document's pages (page order) and meta -> ``{"path", "title", "pages", "markdown",
    "content_list", "figures", "page_engines", "empty_pages", "blocks", "fallbacks"}``, or a
    ``RecordFailure`` past the fallback budget (``max_fallback_share``, 1.0 = off). ``engine``
    names the pages' engine (``page_engines``, the page markers)."""

    def __init__(self, *, max_fallback_share: float = 1.0, page_markers: bool = True,
                 engine: str = "layout") -> None:
        check_fallback_share(max_fallback_share)
        self.max_fallback_share = max_fallback_share
        self.page_markers = page_markers
        self.engine = engine

    def __call__(self, pages: list[list[PageResult]], metas: list[RegionMeta]
                 ) -> list[dict[str, Any] | RecordFailure]:
        out: list[dict[str, Any] | RecordFailure] = []
        for doc_pages, meta in zip(pages, metas, strict=True):
            problem = fallback_budget_problem(doc_pages, self.max_fallback_share)
            if problem is not None:
                out.append(RecordFailure(f"{meta['path']}: {problem}"))
                continue
            fallbacks: Counter[str] = Counter()
            for page in doc_pages:
                fallbacks.update(page["fallbacks"])
            out.append({
                "path": meta["path"], "title": meta["title"], "pages": len(doc_pages),
                "sha256": meta.get("sha256"),
                "markdown": document_markdown(doc_pages, meta, page_markers=self.page_markers,
                                              engine=self.engine),
                "content_list": [entry for page in doc_pages for entry in page["content"]],
                "figures": {name: png for page in doc_pages
                            for name, png in page["figures"].items()},
                "page_engines": [self.engine] * len(doc_pages),
                "empty_pages": [p["page"] for p in doc_pages if not p["content"]],
                "blocks": sum(int(p["blocks"]) for p in doc_pages),
                "fallbacks": dict(sorted(fallbacks.items())),
            })
        return out


__all__ = ["AssemblePage", "AssembleRegionDocument", "assemble_page", "block_markdown",
           "check_fallback_share",
           "content_entry", "document_markdown", "fallback_budget_problem", "figure_name",
           "grid_box"]
