"""A job's input as a recorded spec paged through by one stream: a listing, a manifest.

The input of ``rayorch run pdf|video`` is an :class:`InputSpec`: a prefix or directory with
the suffixes it keeps, or a manifest (``--input-list``, :mod:`rayorch.pipelines.input_lists`).
:class:`InputStream` reads it in the background with a bounded read-ahead (a few windows of
``window`` entries) and hands the driver ``(id, row, identity)`` as admission asks for them:
the first source is dispatched once the first listing page is in.

Ids are listing positions: the ``n``-th entry listed (key order) is id ``n``, whatever order
it is admitted in. Within a window the largest sources go first (a big document dispatched
last keeps one actor busy after the others ran dry); the ids do not change with that order.

What is recorded (the output's marker): the spec. A ``--resume`` lists again and checks, as
it goes, that every id the earlier run delivered names the same source; the first one that
does not stops the run (:class:`InputChanged`) before that id is admitted again. So:

* a key added to the prefix after the run started, sorting after the point the listing
  had reached, is listed and run like any other (its id is its position); one sorting
  before that point is not part of this run;
* a ``--resume`` after keys were added runs the new ones if they sort after every key
  the earlier run delivered (new ids at the end), and is refused, naming the id, if one
  sorts before a delivered key (the ids after it would move).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.pipelines.sources import Listed, list_inputs

WINDOW = 1000
"""Entries per read-ahead window (largest first within one): one object store LIST page."""
READ_AHEAD = 4
"""Windows listed ahead of admission at most (the driver holds these, not the corpus)."""


class InputChanged(RayorchError):
    """The input listed again does not give an earlier run's id the same source."""


@dataclass(frozen=True)
class InputSpec:
    """What a job reads: ``url`` (a directory, prefix or file) with the ``suffixes`` it keeps,
    or with ``manifest`` a manifest of sources (JSONL, CSV, Parquet; ``url`` is it).
    ``what`` names a source in messages (``"PDF"``)."""

    url: str
    suffixes: tuple[str, ...]
    what: str
    manifest: bool = False
    window: int = WINDOW
    archives: bool = False
    """Whether a listed ``.zip``/``.tar``/``.tar.gz`` is a container whose members matching
    ``suffixes`` are the sources (``ARCHIVE#MEMBER``, :mod:`rayorch.pipelines.archives`)."""

    def record(self) -> dict[str, Any]:
        """The spec as the output's marker keeps it (what a ``--resume`` must find again)."""
        return {"kind": "list" if self.manifest else "prefix", "url": self.url,
                "suffixes": list(self.suffixes), "window": self.window,
                "archives": self.archives}

    def pages(self) -> Iterator[list[tuple[Listed, dict[str, Any] | None]]]:
        """The entries in listing order, a page at a time, each with its manifest columns
        (None for a listing)."""
        if self.manifest:
            from rayorch.pipelines.input_lists import read_input_list

            yield from read_input_list(self.url)
            return
        if not self.archives:
            for page in list_inputs(self.url, set(self.suffixes), self.what):
                yield [(listed, None) for listed in page]
            return
        from rayorch.pipelines.archives import LISTED_SUFFIXES, is_archive, list_members

        for page in list_inputs(self.url, set(self.suffixes) | LISTED_SUFFIXES, self.what):
            plain: list[tuple[Listed, dict[str, Any] | None]] = []
            for listed in page:
                if is_archive(listed.name):
                    if plain:
                        yield plain
                        plain = []
                    for members in list_members(listed, self.suffixes):
                        yield [(member, None) for member in members]
                elif Path(listed.name).suffix.lower() in self.suffixes:
                    plain.append((listed, None))
            if plain:
                yield plain


@dataclass
class Entry:
    """One source the stream handed out and the job has not delivered yet."""

    name: str
    metadata: dict[str, Any] | None


class InputStream:
    """The sources of an :class:`InputSpec` as ``(id, (name,), identity)`` in admission
    order (``identity``: what the listing said of it, ``Listed.identity``; None if nothing).

    ``kept``: the rows an earlier run delivered, by id (``--resume``): skipped, and each
    checked against the listing (``InputChanged`` when an id now names another source).
    The listing runs in a thread, at most ``READ_AHEAD`` windows ahead; :meth:`prime` waits
    for the first window (a listing that fails or finds nothing fails before Ray starts).
    ``entries`` holds the sources handed out and not yet released (:meth:`release`).
    """

    def __init__(self, spec: InputSpec, kept: Mapping[int, Mapping[str, Any]] | None = None,
                 *, read_ahead: int = READ_AHEAD) -> None:
        self.spec = spec
        self.kept = kept or {}
        self.listed = 0
        """Entries listed so far (the total once :attr:`done`)."""
        self.done = False
        self.entries: dict[int, Entry] = {}
        self.first_listed: float | None = None
        self._windows: queue.Queue[list[tuple[int, Listed, Any]] | BaseException | None] = \
            queue.Queue(maxsize=read_ahead)
        self._stop = threading.Event()
        self._first: list[tuple[int, Listed, Any]] | None = None
        self._thread = threading.Thread(target=self._list, name="rayorch-listing",
                                        daemon=True)
        self._thread.start()

    # -- the listing thread -------------------------------------------------------------
    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._windows.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _list(self) -> None:
        window: list[tuple[int, Listed, Any]] = []
        position = 0
        try:
            for page in self.spec.pages():
                for listed, metadata in page:
                    window.append((position, listed, metadata))
                    position += 1
                    if len(window) >= self.spec.window:
                        if not self._put(window):
                            return
                        window = []
            if window and not self._put(window):
                return
            self._put(None)
        except BaseException as exc:  # handed to the reader, raised there
            self._put(exc)

    def _next_window(self) -> list[tuple[int, Listed, Any]] | None:
        item = self._windows.get()
        if isinstance(item, BaseException):
            self.done = True
            raise item
        if item is None:
            self.done = True
            return None
        self.listed = item[-1][0] + 1
        return item

    # -- the reader ---------------------------------------------------------------------
    def prime(self) -> int:
        """Wait for the first window; the number of entries it holds (0: none at all)."""
        if self._first is None:
            self._first = self._next_window() or []
        return len(self._first)

    def __iter__(self) -> Iterator[tuple[int, tuple[str], str | None]]:
        self.prime()
        window = self._first
        self._first = []
        while window:
            for position, listed, metadata in sorted(window, key=_largest_first):
                if position in self.kept:
                    self._check_kept(position, listed.name)
                    continue
                self.entries[position] = Entry(listed.name, metadata)
                yield position, (listed.name,), listed.identity or None
            window = self._next_window()

    def _check_kept(self, position: int, name: str) -> None:
        earlier = self.kept[position].get("source")
        if earlier != name:
            raise InputChanged(
                f"--resume: the input changed: id {position} was {str(earlier)[:200]!r} in the "
                f"earlier run and is {name[:200]!r} now (a source was added or removed before "
                "it); use --overwrite to start afresh")

    def name(self, index: int) -> str | None:
        """The source of id ``index`` if it is handed out or kept (else None)."""
        entry = self.entries.get(index)
        if entry is not None:
            return entry.name
        row = self.kept.get(index)
        return None if row is None else row.get("source")

    def metadata(self, index: int) -> dict[str, Any] | None:
        entry = self.entries.get(index)
        return None if entry is None else entry.metadata

    def release(self, index: int) -> None:
        """Source ``index`` is delivered: the stream forgets it."""
        self.entries.pop(index, None)

    def close(self) -> None:
        self._stop.set()


class FixedSources:
    """Sources known up front (a list: the API, tests): what :class:`OutputDir` asks of an
    :class:`InputStream` (``name``, ``metadata``, ``release``), recorded by a digest."""

    def __init__(self, sources: list[str]) -> None:
        self.sources = sources

    def record(self) -> dict[str, Any]:
        digest = hashlib.sha256("\n".join(self.sources).encode()).hexdigest()[:16]
        return {"kind": "sources", "count": len(self.sources), "digest": digest}

    def name(self, index: int) -> str | None:
        return self.sources[index] if 0 <= index < len(self.sources) else None

    def metadata(self, index: int) -> dict[str, Any] | None:
        return None

    def release(self, index: int) -> None:
        """Nothing to forget: the list holds every source."""


def _largest_first(item: tuple[int, Listed, Any]) -> tuple[int, int]:
    return -item[1].size, item[0]


__all__ = ["READ_AHEAD", "WINDOW", "Entry", "FixedSources", "InputChanged", "InputSpec",
           "InputStream"]
