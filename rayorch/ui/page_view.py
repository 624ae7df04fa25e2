"""The page viewer: one page of a document, its layout regions drawn on its image, beside
what was read from each (``/runs/RUN/pages/I.P``; page ``P`` counts from 0, as its path).

Regions are the children of the page entity whose Grain committed a *block* (the region
contract: ``page``, ``order``, ``kind``, ``bbox`` 0..1, ``engine``, ``fallback`` and one of
``text``, ``table``, ``latex``, ``image``), read from the facts (payloads resolved); once a
delivered document's values were freed (store/payload.py), from the content list its job
wrote beside its Markdown (the part record names it). The page image is rendered on demand
from the source (a path or an object store URL; PyMuPDF). Everything read is untrusted: a
block that is not one is left out and counted; a table's HTML is parsed into cells (text,
spans) and rendered by the template, never passed through.
"""

from __future__ import annotations

import html.parser
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from rayorch.core.facts import REPORT_PRESENT
from rayorch.core.ids import Path
from rayorch.store.payload import is_freed

MAX_SIDE_PX = 1400  # the page image's longer side
CELL_TEXT = 2000  # characters of a cell or block shown
GRID = 1000.0  # the content list's box grid


@dataclass(frozen=True)
class Cell:
    text: str
    colspan: int = 1
    rowspan: int = 1
    header: bool = False


@dataclass(frozen=True)
class Region:
    """One region of the page as the viewer shows it (every field checked)."""

    order: int
    kind: str
    box: tuple[float, float, float, float]  # 0..1000 of the page
    engine: str = ""
    fallback: str = ""
    cause: str = ""
    text: str = ""
    latex: str = ""
    table: tuple[tuple[Cell, ...], ...] = ()
    table_text: str = ""  # a Markdown table, shown as it is
    has_image: bool = False
    path: Path | None = None  # its Grain's entity (the lineage link)


@dataclass
class PageView:
    run_id: str
    path: Path  # (source, page index)
    pages: int | None
    source: str
    regions: list[Region] = field(default_factory=list)
    origin: str = ""  # "facts", "content list" or "" (none found)
    skipped: int = 0  # blocks that were not blocks
    note: str = ""

    @property
    def number(self) -> int:
        return self.path[1] + 1


class _TableCells(html.parser.HTMLParser):
    """The rows and cells of a table's HTML: text and spans only (nothing else survives)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[Cell]] = []
        self._cell: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            spans = {k: _span(v) for k, v in attrs if k in ("colspan", "rowspan")}
            self._cell = {"text": [], "header": tag == "th", **spans}

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            if not self.rows:
                self.rows.append([])
            text = " ".join("".join(self._cell.pop("text")).split())[:CELL_TEXT]
            self.rows[-1].append(Cell(text, **self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell["text"].append(data)


def _span(value: str | None) -> int:
    try:
        return min(max(int(str(value)), 1), 100)
    except ValueError:
        return 1


def table_cells(markup: str) -> tuple[tuple[Cell, ...], ...]:
    """A table's HTML as rows of cells (text, colspan, rowspan); nothing else of it kept.

    >>> table_cells('<table><tr><th colspan="2">a<script>x</script></th></tr></table>')
    ((Cell(text='ax', colspan=2, rowspan=1, header=True),),)
    """
    parser = _TableCells()
    parser.feed(markup[:200_000])
    parser.close()
    return tuple(tuple(row) for row in parser.rows if row)


def _text(value: Any) -> str:
    return str(value)[:CELL_TEXT] if isinstance(value, str) else ""


def _box(value: Any, scale: float) -> tuple[float, float, float, float] | None:
    """A box of four finite numbers as 0..1000 of the page (``scale``: what 1000 is)."""
    if not isinstance(value, (list, tuple)) or len(value) < 4:
        return None
    try:
        x0, y0, x1, y1 = (float(v) * GRID / scale for v in value[:4])
    except (TypeError, ValueError):
        return None
    if not all(-1.0 <= v <= GRID + 1.0 for v in (x0, y0, x1, y1)) or x1 < x0 or y1 < y0:
        return None
    return (x0, y0, x1, y1)


def region_of_block(block: Any, path: Path | None) -> Region | None:
    """A committed block as a :class:`Region`, or None when it is not a block."""
    if not isinstance(block, dict):
        return None
    box = _box(block.get("bbox"), 1.0)
    order, kind = block.get("order"), block.get("kind")
    if box is None or not isinstance(order, int) or isinstance(order, bool) \
            or not isinstance(kind, str):
        return None
    table = block.get("table") if isinstance(block.get("table"), dict) else {}
    markup = _text(table.get("html")) if table else ""
    return Region(order=order, kind=kind[:40], box=box, engine=_text(block.get("engine"))[:40],
                  fallback=_text(block.get("fallback"))[:40], cause=_text(block.get("cause")),
                  text=_text(block.get("text")), latex=_text(block.get("latex")),
                  table=table_cells(markup) if markup else (),
                  table_text=_text(table.get("markdown")) if table else "",
                  has_image=isinstance(block.get("image"), (bytes, bytearray)), path=path)


def region_of_entry(entry: Any, order: int) -> Region | None:
    """A content-list entry (MinerU's shape, 0..1000 boxes) as a :class:`Region`."""
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        return None
    box = _box(entry.get("bbox"), GRID)
    if box is None:
        return None
    kind = str(entry.get("region_kind") or entry["type"])[:40]
    if isinstance(entry.get("order"), int) and not isinstance(entry.get("order"), bool):
        order = int(entry["order"])
    body = _text(entry.get("table_body"))
    cells = table_cells(body) if body.lstrip().startswith("<") else ()
    return Region(order=order, kind=kind, box=box, fallback=_text(entry.get("fallback"))[:40],
                  text=_text(entry.get("text")), latex=_text(entry.get("latex")),
                  table=cells, table_text="" if cells else body,
                  has_image=bool(entry.get("img_path")))


class PageImages:
    """Page PNGs rendered on demand from their source (the newest few kept)."""

    def __init__(self, keep: int = 16) -> None:
        self._cache: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._keep = keep
        self._lock = threading.Lock()

    def png(self, source: str, page: int) -> bytes:
        """Page ``page`` (from 0) of the PDF at ``source`` as PNG; ``LookupError`` saying
        why when there is none (not a PDF, no such page, unreadable)."""
        key = (source, page)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        png = render_page(source, page)
        with self._lock:
            self._cache[key] = png
            while len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        return png


def render_page(source: str, page: int) -> bytes:
    """One page of the PDF at ``source`` (a path or URL) as PNG, longer side MAX_SIDE_PX."""
    try:
        from rayorch.pipelines.document.pdf_markdown import import_pymupdf

        pymupdf = import_pymupdf()
    except Exception:
        raise LookupError("rendering pages needs PyMuPDF: pip install 'rayorch[pdf]'") from None
    from rayorch.pipelines.input_files import check_file

    if not source:
        raise LookupError("the source is not a file path or URL: no page image")
    try:
        data = check_file(source, "PDF", 1024, whole=True).read()
        with pymupdf.open(stream=data, filetype="pdf") as doc:
            if not 0 <= page < doc.page_count:
                raise LookupError(f"the source has {doc.page_count} pages, not page {page + 1}")
            rect = doc[page].rect
            zoom = MAX_SIDE_PX / max(rect.width, rect.height, 1.0)
            return bytes(doc[page].get_pixmap(matrix=pymupdf.Matrix(zoom, zoom)).tobytes("png"))
    except LookupError:
        raise
    except Exception as exc:  # the source is data: say why, keep the page without its image
        raise LookupError(f"cannot render the page: {type(exc).__name__}: "
                          f"{str(exc)[:200]}") from None


def page_regions(store: Any, shard: Any, path: Path) -> tuple[list[Region], int, int]:
    """``(regions, blocks that were not blocks, values no longer readable)`` of page
    ``path`` from the facts: the committed Present outputs of its children's Grains."""
    regions: list[Region] = []
    skipped = unreadable = 0
    for key in shard.by_source.get(path[0], ()):  # the source's Grains, not the shard's
        grain_path, grain = key[1], shard.grains[key]
        if len(grain_path) != len(path) + 1 or tuple(grain_path[:len(path)]) != path:
            continue
        commit = grain.commit or grain.reuse
        if commit is None or commit.outcome != REPORT_PRESENT:
            continue
        try:
            resolved = store.resolve_payload(commit)
        except Exception:  # freed after delivery, or unreachable: the content list says
            unreadable += 1
            continue
        if is_freed(resolved):  # read back as its outline: freed after delivery
            unreadable += 1
            continue
        outputs = resolved.outputs or ()
        region = region_of_block(outputs[0] if outputs else None, grain_path)
        if region is None:
            skipped += 1
        else:
            regions.append(region)
    return sorted(regions, key=lambda r: r.order), skipped, unreadable


def content_list_regions(sink_url: str, record_value: Any, page: int) -> list[Region]:
    """Page ``page``'s regions from the content list a job wrote beside its Markdown."""
    from rayorch.storage import open_storage

    if not isinstance(record_value, dict) or not isinstance(record_value.get("content_list"),
                                                            str):
        return []
    name = record_value["content_list"]
    if name.startswith("/") or ".." in name.split("/"):
        return []  # the store's data names no file outside the output directory
    entries = json.loads(open_storage(sink_url).read(name))
    on_page = [e for e in entries if isinstance(e, dict) and e.get("page_idx") == page]
    regions = [region_of_entry(e, i) for i, e in enumerate(on_page)]
    return [r for r in regions if r is not None]


def delivered_value(sink: tuple[str, str] | None, part: str, index: int) -> Any:
    """Source ``index``'s record value in part ``part`` of the run's sink (None: none)."""
    from rayorch.runtime.sinks import read_part
    from rayorch.storage import open_storage

    if sink is None or ":" not in part:
        return None
    name = part.partition(":")[2]
    if "/" in name:
        return None
    for record, _ in read_part(open_storage(sink[0]), name):
        if record.index == index and record.value_json is not None:
            return json.loads(record.value_json)
    return None


def page_view(live: Any, path: Path) -> PageView:
    """What the viewer shows of page ``path`` (source, page index) of ``live``'s run."""
    index, page = path
    shard = live.view.shards.get(live.info.shard_of(index))
    admitted = shard.admitted.get(index) if shard is not None else None
    values = admitted[-1][1].values if admitted else ()
    source = values[0] if values and isinstance(values[0], str) else ""
    pages = None  # as many as the source's page entities with a Grain
    if shard is not None:
        pages = len({g[1] for (_, g) in shard.by_source.get(index, ()) if len(g) >= 2}) or None
    view = PageView(live.run_id, path, pages, source)
    if shard is None:
        view.note = "no facts about this source yet"
        return view
    view.regions, view.skipped, unreadable = page_regions(live.store, shard, path)
    if view.regions:
        view.origin = "facts"
        return view
    emitted = shard.emitted.get(index)
    if emitted:
        try:
            value = delivered_value(live.info.sink, emitted[-1][1].sink, index)
            regions = content_list_regions(live.info.sink[0], value, page) if value else []
        except Exception as exc:  # the output may be gone or moved: say so, show the rest
            view.note = f"the delivered content list cannot be read: {type(exc).__name__}"
            return view
        grains = {g for (_, g) in shard.by_source.get(index, ())}
        regions = [replace(r, path=(index, page, r.order)
                           if (index, page, r.order) in grains else None) for r in regions]
        view.regions, view.origin = regions, "content list" if regions else ""
    if not view.regions:
        view.note = ("no regions: this page has no layout children" if not unreadable else
                     f"{unreadable} regions' values were freed after delivery and the "
                     "run's outputs hold no content list for them")
    return view


__all__ = ["Cell", "PageImages", "PageView", "Region", "content_list_regions", "delivered_value",
           "page_regions", "page_view",
           "region_of_block", "region_of_entry", "render_page", "table_cells"]
