"""The one storage layer: every byte rayorch reads or writes goes through a :class:`Storage`.

>>> out = open_storage("s3://corpus/out")          # doctest: +SKIP
>>> out.create("part-1.jsonl", b"...")              # True; False if it exists (never replaced)
>>> for page in out.walk(""): ...                   # paged listing, never one big list

A :class:`Storage` is rooted at a location (a directory or a bucket prefix) and takes
relative keys. Its operations are the ones exactly-once delivery rests on: ``create``
(whole or not at all, never over an existing object), ``put`` (replace, atomically),
``read``/``read_range``, ``head``, ``delete`` (missing is fine), ``walk`` (a folder's
objects, page by page). Local paths are :class:`LocalStorage` (POSIX, fsync'd); ``s3://``,
``gs://`` and ``az://`` are :class:`ObjectStorage` (obstore; extras ``s3``, ``gcs``,
``azure``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

from rayorch.storage.local import LocalStorage, fsync_dir
from rayorch.storage.location import (
    Location,
    StorageError,
    StorageUnavailableError,
    check_key,
    parse_location,
)
from rayorch.storage.objects import ObjectInfo, ObjectStorage, open_object_store


class Storage(Protocol):
    """Keys below one location; see the module doc."""

    location: Location
    is_local: bool

    @property
    def url(self) -> str: ...
    def local_path(self, key: str) -> Path | None: ...
    def create(self, key: str, data: bytes) -> bool: ...
    def put(self, key: str, data: bytes) -> None: ...
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


def join(url: str | Path, *keys: str) -> str:
    """The URL (or path) of ``keys`` below ``url``."""
    return parse_location(url).join(*keys).url


__all__ = ["Location", "LocalStorage", "ObjectInfo", "ObjectStorage", "Storage", "StorageError",
           "StorageUnavailableError", "check_key", "fsync_dir", "is_url", "join", "open_storage",
           "parse_location", "parse_storage_options", "set_storage_options", "storage_options"]
