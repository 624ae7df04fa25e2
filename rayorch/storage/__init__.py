"""The one storage layer: every byte rayorch reads or writes goes through a :class:`Storage`.

>>> out = open_storage("s3://corpus/out")          # doctest: +SKIP
>>> out.create("part-1.jsonl", b"...")              # True; False if it exists (never replaced)
>>> for page in out.walk(""): ...                   # paged listing, never one big list

A :class:`Storage` is rooted at a location (a directory or a bucket prefix) and takes
relative keys. Its operations are the ones exactly-once delivery rests on: ``create``
(whole or not at all, never over an existing object), ``put`` (replace, atomically;
``put_file`` from a local file, streamed: a view of a million rows is not held in memory),
``read``/``read_range``, ``head``, ``delete`` (missing is fine), ``walk`` (a folder's
objects, page by page). Local paths are :class:`LocalStorage` (POSIX, fsync'd); ``s3://``,
``gs://`` and ``az://`` are :class:`ObjectStorage` (obstore; extras ``s3``, ``gcs``,
``azure``).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

from rayorch.core.reuse import UNKNOWN_IDENTITY
from rayorch.storage.local import LocalStorage, fsync_dir
from rayorch.storage.location import (
    Location,
    StorageError,
    StorageUnavailableError,
    check_key,
    parse_location,
)
from rayorch.storage.objects import (
    IDENTITY_FORMAT,
    ObjectInfo,
    ObjectStorage,
    open_object_store,
)


class Storage(Protocol):
    """Keys below one location; see the module doc."""

    location: Location
    is_local: bool

    @property
    def url(self) -> str: ...
    def local_path(self, key: str) -> Path | None: ...
    def create(self, key: str, data: bytes) -> bool: ...
    def put(self, key: str, data: bytes) -> None: ...
    def put_file(self, key: str, path: Path) -> None: ...
    def read(self, key: str) -> bytes: ...
    def read_range(self, key: str, start: int, end: int) -> bytes: ...
    def head(self, key: str) -> ObjectInfo | None: ...
    def delete(self, key: str) -> None: ...
    def walk(self, folder: str = "") -> Iterator[list[ObjectInfo]]: ...
    def names(self, prefix: str = "") -> Iterator[list[str]]: ...
    def exists_dir(self) -> bool: ...
    def make_dir(self) -> None: ...
    def remove_empty_dirs(self, prefix: str = "") -> None: ...


_lock = threading.Lock()
_options: dict[str, str] = {}
_stores: dict[tuple[str, tuple[tuple[str, str], ...]], object] = {}


def set_storage_options(options: Mapping[str, str]) -> None:
    """Options for every object store this process opens (``--storage-option``): merged
    over the cloud's environment. Kept in memory only; never printed or recorded."""
    bad = [k for k in options if not isinstance(k, str) or not k]
    if bad:
        raise StorageError("storage options are KEY=VALUE pairs with a non-empty KEY")
    with _lock:
        _options.clear()
        _options.update({k: str(v) for k, v in options.items()})
        _stores.clear()


def storage_options() -> dict[str, str]:
    """This process's storage options (to hand to the actors it starts, in memory)."""
    with _lock:
        return dict(_options)


def parse_storage_options(pairs: list[str] | None) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` (the CLI's ``--storage-option``) as a dict."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise StorageError(f"--storage-option takes KEY=VALUE, not {key.strip()[:40]!r}…")
        out[key.strip()] = value
    return out


def open_storage(url: str | Path | Location,
                 options: Mapping[str, str] | None = None) -> Storage:
    """The storage at ``url`` (a path, ``file://``, ``s3://``, ``gs://`` or ``az://`` URL)."""
    location = parse_location(url)
    if location.is_local:
        return LocalStorage(location)
    with _lock:
        merged = {**_options, **(options or {})}
        cache_key = (location.root, tuple(sorted(merged.items())))
        store = _stores.get(cache_key)
    if store is None:
        store = open_object_store(location, merged)
        with _lock:
            _stores[cache_key] = store
    return ObjectStorage(location, store)


def is_url(text: str | Path) -> bool:
    """True for a URL of an object store (not a local path or ``file://``)."""
    return not parse_location(text).is_local


# UNKNOWN_IDENTITY: the identity of an object a source names when no listing gave it; its
# Grains are not reused (learning its version would take a request on the driver).


def value_identity(value: object) -> str | None:
    """The identity (:attr:`ObjectInfo.identity`) of what a source value names, from
    metadata only, never its bytes: a local regular file's size and mtime (one ``stat``),
    :data:`UNKNOWN_IDENTITY` for an object store URL, None for a value naming no file."""
    if not isinstance(value, str | os.PathLike) or not value:
        return None
    try:
        location = parse_location(os.fspath(value))
    except (StorageError, TypeError, ValueError):
        return None
    if not location.is_local:
        return UNKNOWN_IDENTITY
    try:
        st = os.stat(os.fspath(value))
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return ObjectInfo("", st.st_size, None, st.st_mtime, mtime_ns=st.st_mtime_ns).identity


def row_identity(values: tuple[object, ...]) -> str | None:
    """The identity of a source row (one value per forward argument): its files'
    identities (:func:`value_identity`), :data:`UNKNOWN_IDENTITY` if one is unknown, None
    when it names no file."""
    found = [i for i in map(value_identity, values) if i is not None]
    if not found:
        return None
    if UNKNOWN_IDENTITY in found:
        return UNKNOWN_IDENTITY
    return found[0] if len(found) == 1 else " | ".join(found)


def join(url: str | Path, *keys: str) -> str:
    """The URL (or path) of ``keys`` below ``url``."""
    return parse_location(url).join(*keys).url


__all__ = ["IDENTITY_FORMAT", "UNKNOWN_IDENTITY", "LocalStorage", "Location", "ObjectInfo",
           "ObjectStorage", "Storage", "StorageError", "StorageUnavailableError", "check_key",
           "fsync_dir", "is_url", "join", "open_storage", "parse_location",
           "parse_storage_options", "row_identity", "set_storage_options", "storage_options",
           "value_identity"]
