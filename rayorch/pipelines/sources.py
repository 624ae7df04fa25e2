"""The input files of a job: finding them, the first checks on each, and failure causes.

Shared by the PDF and video jobs (and run inside their actors): a bad file becomes
``ro.RecordFailure("<kind>: <detail>")`` for that source only, and ``failure_kind``
counts causes by kind (docs/topics/PIPELINES.md, "PDF pipeline" and "Video pipeline").
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rayorch.core.errors import RayorchError
from rayorch.core.outcome import RecordFailure
from rayorch.storage import (
    Location,
    ObjectInfo,
    Storage,
    StorageError,
    open_storage,
    parse_location,
)


def refuse(kind: str, detail: str) -> RecordFailure:
    """A per-source failure whose cause reads ``"<kind>: <detail>"`` on one line."""
    return RecordFailure(f"{kind}: {' '.join(detail.split())}")


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


@dataclass(frozen=True)
class InputFile:
    """One input, checked: a local file (``path``) or an object (``url``), its first bytes.

    ``name`` is what messages print (the path or the URL). :meth:`read` gives all its
    bytes; a worker reads its own input from the object store (no shared disk).
    """

    name: str
    head: bytes
    size: int
    path: Path | None = None
    url: str | None = None
    data: bytes | None = None  # an object read whole at the check (``whole=True``)

    def read(self) -> bytes:
        if self.data is not None:
            return self.data
        if self.path is not None:
            return self.path.read_bytes()
        storage, key = self._object()
        try:
            return storage.read(key)
        except FileNotFoundError:
            raise refuse("missing", f"{self.name} does not exist") from None
        except StorageError as exc:
            raise refuse("unreadable", f"{self.name}: {exc}") from None

    def tail(self, count: int) -> bytes:
        """Its last ``count`` bytes (one ranged read on an object store)."""
        start = max(0, self.size - count)
        if self.data is not None:
            return self.data[start:]
        if self.path is not None:
            with self.path.open("rb") as fh:
                fh.seek(start)
                return fh.read()
        storage, key = self._object()
        return storage.read_range(key, start, self.size)

    def _object(self) -> tuple[Storage, str]:
        """The storage holding this object, and its key there."""
        location = parse_location(str(self.url))
        return open_storage(location.parent()), location.name()


def check_file(source: Any, what: str, head_bytes: int, *, whole: bool = False) -> InputFile:
    """``source`` (a path or an object store URL) as a non-empty file and its first
    ``head_bytes``; ``whole``: an object is read whole at once (one GET, no HEAD: for a
    caller that reads all of it anyway).

    Raises ``RecordFailure`` (kinds: bad input, missing, not a file, empty, unreadable);
    ``what`` names the expected file in the message (``"PDF"``, ``"video"``).
    """
    if not isinstance(source, (str, Path)):
        raise refuse("bad input", f"expected a {what} path (str), got {type(source).__name__}")
    if isinstance(source, str) and "#" in source and not Path(source).exists():
        from rayorch.pipelines.archives import read_member, split_member

        if split_member(source) is not None:  # ARCHIVE#MEMBER: read by this actor
            data = read_member(source)
            if not data:
                raise refuse("empty", f"{source} is an empty member (0 bytes)")
            return InputFile(source, data[:head_bytes], len(data), data=data)
    try:
        location = parse_location(source)
    except StorageError as exc:
        raise refuse("bad input", str(exc)) from None
    if not location.is_local:
        return _check_object(location, head_bytes, whole)
    path = Path(source)
    if not path.exists():
        raise refuse("missing", f"{path} does not exist")
    if not path.is_file():
        raise refuse("not a file", f"{path} is a directory or special file")
    with path.open("rb") as fh:
        head = fh.read(head_bytes)
    if not head:
        raise refuse("empty", f"{path} is an empty file (0 bytes)")
    return InputFile(str(path), head, path.stat().st_size, path=path)


def _check_object(location: Location, head_bytes: int, whole: bool) -> InputFile:
    name = location.url
    try:
        storage = open_storage(location.parent())
        if whole:
            try:
                data = storage.read(location.name())
            except FileNotFoundError:
                raise refuse("missing", f"{name} does not exist") from None
            if not data:
                raise refuse("empty", f"{name} is an empty object (0 bytes)")
            return InputFile(name, data[:head_bytes], len(data), url=name, data=data)
        info = storage.head(location.name())
        if info is None:
            raise refuse("missing", f"{name} does not exist")
        if info.size == 0:
            raise refuse("empty", f"{name} is an empty object (0 bytes)")
        head = storage.read_range(location.name(), 0, min(head_bytes, info.size))
    except StorageError as exc:
        raise refuse("unreadable", f"{name}: {exc}") from None
    return InputFile(name, head, info.size, url=name)


class Listed(NamedTuple):
    """One input as its listing names it: ``name`` (a path or URL), ``size`` in bytes and
    ``identity`` (:attr:`~rayorch.storage.ObjectInfo.identity`: size with version, ETag or
    mtime), what reuse keys the source by: no byte of it is read to list it."""

    name: str
    size: int
    identity: str


PAGE = 1000
"""Entries per page of a local listing (an object store's page is its LIST page)."""


def _local_pages(root: Path, suffixes: Collection[str]) -> Iterator[list[Listed]]:
    """Files below ``root`` in key order (names sorted per directory, depth first: the order
    of their relative paths), ``PAGE`` at a time, while the walk goes on."""
    page: list[Listed] = []

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

    for listed in walk(root):
        page.append(listed)
        if len(page) >= PAGE:
            yield page
            page = []
    if page:
        yield page


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


__all__ = ["PAGE", "InputFile", "Listed", "check_file", "failure_kind", "find_files",
           "list_inputs", "refuse", "slug"]
