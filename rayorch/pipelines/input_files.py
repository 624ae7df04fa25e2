"""One input checked and read where it is used (a worker: the driver reads no input).

:func:`check_file` takes a source as a job names it: a local path, an object store URL, or
a member of a zip/tar archive (``ARCHIVE#MEMBER``, :mod:`rayorch.pipelines.archives`), and
gives an :class:`InputFile`: its first bytes checked, the rest read on demand. Bad input is a
``RecordFailure`` for that source alone (kinds: bad input, missing, not a file, empty,
unreadable).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rayorch.pipelines.archives import read_member, split_member
from rayorch.pipelines.sources import refuse
from rayorch.storage import Location, Storage, StorageError, open_storage, parse_location


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
    if isinstance(source, str) and "#" in source and not Path(source).exists() \
            and split_member(source) is not None:  # ARCHIVE#MEMBER: read by this actor
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


class Prefetcher:
    """Reads a batch's inputs on object stores ahead, on threads, while the actor works on the
    ones before: an actor that renders a one-page PDF in ~3 ms waits ~20-50 ms on its GET,
    one at a time. At most ``ahead`` inputs are read or held at once; local files and archive
    members are left to ``check`` in the actor's own thread, as they were.

    >>> with Prefetcher(ahead=4) as fetch:                         # doctest: +SKIP
    ...     for source, got in fetch(sources, check):              # got: InputFile or exception
    ...         ...
    """

    def __init__(self, ahead: int = 4) -> None:
        self.ahead = ahead
        self._pool: ThreadPoolExecutor | None = None

    def __call__(self, sources: Sequence[Any], check: Callable[[Any], InputFile]
                 ) -> Iterator[tuple[Any, Callable[[], InputFile]]]:
        """``(source, get)`` in order; ``get()`` gives ``check(source)``'s file or raises what
        it raised (in the caller's thread: a failure stays that source's)."""
        remote = [_is_remote(source) for source in sources]
        if sum(remote) < 2 or self.ahead < 2:
            for source in sources:
                yield source, functools.partial(check, source)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.ahead, thread_name_prefix="rayorch-fetch")
        pending: dict[int, Future[InputFile]] = {}
        upcoming = iter(i for i, r in enumerate(remote) if r)
        for _ in range(self.ahead):
            self._submit(pending, upcoming, sources, check)
        for i, source in enumerate(sources):
            future = pending.pop(i, None)
            if future is None:
                yield source, functools.partial(check, source)
                continue
            try:
                yield source, future.result
            finally:
                del future  # its bytes go with the work on them
                self._submit(pending, upcoming, sources, check)

    def _submit(self, pending: dict[int, Future[InputFile]], upcoming: Iterator[int],
                sources: Sequence[Any], check: Callable[[Any], InputFile]) -> None:
        assert self._pool is not None
        i = next(upcoming, None)
        if i is not None:
            pending[i] = self._pool.submit(check, sources[i])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_remote(source: Any) -> bool:
    """Whether ``source`` names an object on an object store (read with a GET)."""
    if not isinstance(source, str) or "://" not in source:
        return False
    if "#" in source and split_member(source) is not None:
        return False  # an archive member: read through its archive
    try:
        return not parse_location(source).is_local
    except StorageError:
        return False


__all__ = ["InputFile", "Prefetcher", "check_file"]
