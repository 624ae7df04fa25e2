"""The input files of a job: finding them, the first checks on each, and failure causes.

Shared by the PDF and video jobs (and run inside their actors): a bad file becomes
``ro.RecordFailure("<kind>: <detail>")`` for that source only, and ``failure_kind``
counts causes by kind (docs/topics/PIPELINES.md, "PDF pipeline" and "Video pipeline").
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from rayorch.core.errors import RayorchError
from rayorch.core.outcome import RecordFailure
from rayorch.storage import (
    ObjectInfo,
    StorageError,
    open_storage,
    parse_location,
)


def refuse(kind: str, detail: str) -> RecordFailure:
    """A per-source failure whose cause reads ``"<kind>: <detail>"`` on one line."""
    return RecordFailure(f"{kind}: {' '.join(detail.split())}")


def each_alone(items: Iterable[Any], work: Callable[[Any], Any],
               label: Callable[[Any], str]) -> list[Any]:
    """``work(item)`` per item, in order; a ``RecordFailure`` or any exception fails that item
    only (``"unreadable: <label>: <type>: <text>"``), never its batch-mates."""
    results: list[Any] = []
    for item in items:
        try:
            results.append(work(item))
        except RecordFailure as failure:
            results.append(failure)
        except Exception as exc:  # one bad record must never fail the batch
            results.append(refuse("unreadable", f"{label(item)}: {type(exc).__name__}: {exc}"))
    return results


def slug(text: str) -> str:
    """A file-name-safe form of ``text`` (at most 80 characters)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:80] or "document"


_PROPAGATED = re.compile(r"^[\w.@]+\[[\d.]+\] failed: ")


def failure_kind(cause: str | None) -> str:
    """The stable part of a cause, for counting failures by kind.

    ``"encrypted: x.pdf needs ..."`` -> ``"encrypted"``; a cause propagated by the
    runtime (``"render[3] failed: encrypted: ..."``) counts as its origin's kind.

    >>> failure_kind("probe[0] failed: empty: a.mp4 is an empty file (0 bytes)")
    'empty'
    """
    if not cause:
        return "unknown"
    while _PROPAGATED.match(cause):
        cause = _PROPAGATED.sub("", cause, count=1)
    return cause.split(":", 1)[0].strip()[:60]


class Listed(NamedTuple):
    """One input as its listing names it: ``name`` (a path or URL), ``size`` in bytes and
    ``identity`` (:attr:`~rayorch.storage.ObjectInfo.identity`: size with version, ETag or
    mtime), what reuse keys the source by: no byte of it is read to list it."""

    name: str
    size: int
    identity: str


PAGE = 1000
"""Entries per page of a local listing (an object store's page is its LIST page)."""


def paged(entries: Iterable[Listed]) -> Iterator[list[Listed]]:
    """``entries`` ``PAGE`` at a time, each page given as soon as it is full."""
    page: list[Listed] = []
    for listed in entries:
        page.append(listed)
        if len(page) >= PAGE:
            yield page
            page = []
    if page:
        yield page


def _local_pages(root: Path, suffixes: Collection[str]) -> Iterator[list[Listed]]:
    """Files below ``root`` in key order (names sorted per directory, depth first: the order
    of their relative paths), ``PAGE`` at a time, while the walk goes on."""

    def walk(folder: Path) -> Iterator[Listed]:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=True):
                yield from walk(Path(entry.path))
            elif Path(entry.name).suffix.lower() in suffixes and entry.is_file():
                yield _listed_stat(entry.path, entry.stat())

    yield from paged(walk(root))


def _listed_stat(name: str, st: os.stat_result) -> Listed:
    info = ObjectInfo("", st.st_size, None, st.st_mtime, mtime_ns=st.st_mtime_ns)
    return Listed(name, st.st_size, info.identity)


def _one_local(path: Path) -> Listed:
    return _listed_stat(str(path), path.stat())


def list_inputs(source: str | Path, suffixes: Collection[str], what: str
                ) -> Iterator[list[Listed]]:
    """The files under ``source`` (a directory or an object store prefix) whose suffix is
    one of ``suffixes``, a listing page at a time in key order, each a :class:`Listed`
    (name, size, identity); or ``source`` itself when it names one file; ``what`` names them
    in the error. Lazy: the first page comes before the rest is listed."""
    location = parse_location(source)
    if location.is_local:
        root = Path(location.root)
        if root.is_dir():
            yield from _local_pages(root, suffixes)
            return
        if root.exists():
            yield [_one_local(root)]
            return
        raise RayorchError(f"input {root} does not exist: pass a {what} file or a directory "
                           f"of {what}s")
    try:
        storage = open_storage(location)
        listed = False
        for page in storage.walk(""):
            listed = True
            found = [Listed(location.join(info.key).url, info.size, info.identity)
                     for info in page if Path(info.key).suffix.lower() in suffixes]
            if found:
                yield found
        if listed or not location.prefix:
            return
        one = open_storage(location.parent()).head(location.name())
    except StorageError as exc:
        raise RayorchError(f"cannot list the input {location.url}: {exc}") from None
    if one is None:
        raise RayorchError(f"input {location.url} does not exist: pass a {what} object or a "
                           f"prefix holding {what}s")
    yield [Listed(location.url, one.size, one.identity)]


def find_files(source: str | Path, suffixes: Collection[str], what: str) -> list[str]:
    """The files :func:`list_inputs` finds, as one sorted list."""
    return sorted(name for page in list_inputs(source, suffixes, what)
                  for name, _, _ in page)


__all__ = ["PAGE", "Listed", "each_alone", "failure_kind", "find_files", "list_inputs",
           "paged", "refuse", "slug"]
