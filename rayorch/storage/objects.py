"""Object stores (S3, GCS, Azure Blob) behind the storage interface, on obstore.

obstore (Rust's ``object_store``) gives one API over the three clouds with what
exactly-once delivery needs: a conditional create (``mode="create"``: S3 ``If-None-Match:
*``, GCS ``ifGenerationMatch=0``, Azure ``If-None-Match: *``), single-request PUTs (an
object is whole or absent), paged listings and ranged reads, with retries of throttling
and dropped connections (docs/topics/STORAGE.md, "Storage is a URL").

Credentials and endpoints come from each cloud's own environment (``AWS_*`` including
``AWS_ENDPOINT_URL`` and, with boto3 installed, ``AWS_PROFILE``; ``GOOGLE_*``;
``AZURE_STORAGE_*``) and from storage options (``--storage-option KEY=VALUE``). Options
are kept in this process only: never printed, never written to a run's manifest or facts.

A request that still fails after obstore's own retries because the store is unreachable
is retried here, with one line on stderr, for up to ``$RAYORCH_STORAGE_PATIENCE_S``
(600 s) before :class:`StorageUnavailableError`.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from rayorch.core.errors import MissingExtraError
from rayorch.storage.location import Location, StorageError, StorageUnavailableError

T = TypeVar("T")
PAGE = 1000  # keys per listing request (S3's maximum)


IDENTITY_FORMAT = "id1"
"""The version of :attr:`ObjectInfo.identity`'s form: reuse keys of runs that recorded
another form never match (a change of form is a new version, never a silent collision)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: its key below the storage root, size, version (S3 version id,
    GCS generation), mtime (epoch s; ``mtime_ns`` locally), ETag."""

    key: str
    size: int
    version: str | None = None
    mtime: float | None = None
    etag: str | None = None
    mtime_ns: int | None = None

    @property
    def identity(self) -> str:
        """This version of the object as the listing names it, without reading a byte: its
        size with its version, else its ETag, else its mtime (a local file). What reuse
        keys a source by (docs/topics/REUSE.md, "Reuse")."""
        if self.version:
            tag = f"version={self.version}"
        elif self.etag:
            tag = f"etag={self.etag}"
        elif self.mtime_ns is not None:
            tag = f"mtime_ns={self.mtime_ns}"
        else:
            tag = f"mtime={self.mtime!r}"
        return f"{IDENTITY_FORMAT} size={self.size} {tag}"


def _first_line(exc: BaseException) -> str:
    """An obstore error as one short line (its debug dump and response bodies left out)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for cut in (": <?xml", " - Server returned", "\nDebug source"):
        text = text.split(cut)[0]
    return text[:300]


def _patience_s() -> float:
    try:
        return max(0.0, float(os.environ.get("RAYORCH_STORAGE_PATIENCE_S", "600")))
    except ValueError:
        return 600.0


class _Outage:
    """Says once on stderr that a store is unreachable, and once that it is back."""

    _lock = threading.Lock()
    _down: set[str] = set()

    @classmethod
    def down(cls, url: str, cause: str, patience: float) -> None:
        with cls._lock:
            if url in cls._down:
                return
            cls._down.add(url)
        print(f"rayorch: object store {url} unreachable ({cause}); retrying for up to "
              f"{patience:.0f} s", file=sys.stderr, flush=True)

    @classmethod
    def up(cls, url: str) -> None:
        with cls._lock:
            if url not in cls._down:
                return
            cls._down.discard(url)
        print(f"rayorch: object store {url} reachable again", file=sys.stderr, flush=True)


def _obstore() -> Any:
    try:
        import obstore
    except ImportError:
        return None
    return obstore


_ENDPOINT_ENV = {"azure": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"),
                 "gcs": ("GOOGLE_SERVICE_ENDPOINT",)}


def open_object_store(location: Location, options: Mapping[str, str]) -> Any:
    """The obstore store for a bucket (``location.root``), with rayorch's retry settings."""
    if _obstore() is None:
        raise MissingExtraError(f"a {location.root.partition(':')[0]}:// URL", "obstore",
                                location.extra)
    from obstore.exceptions import BaseError
    from obstore.store import from_url

    kwargs: dict[str, Any] = {
        "retry_config": {"max_retries": 4, "retry_timeout": timedelta(seconds=10),
                         "backoff": {"init_backoff": timedelta(milliseconds=100),
                                     "max_backoff": timedelta(seconds=2), "base": 2}},
        "client_options": {"connect_timeout": timedelta(seconds=5),
                           "timeout": timedelta(seconds=120)},
    }
    config = dict(options)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if location.kind == "s3" and endpoint and "endpoint" not in config \
            and "aws_endpoint" not in config:
        config["endpoint"] = endpoint
    # An emulator or an in-cluster server speaks plain HTTP: allowed when its endpoint says so.
    named = [str(v) for k, v in config.items() if "endpoint" in k.lower()]
    named += [os.environ.get(k, "") for k in _ENDPOINT_ENV.get(location.kind, ())]
    if any(e.startswith("http://") for e in named):
        kwargs["client_options"]["allow_http"] = True
    if location.kind == "s3" and os.environ.get("AWS_PROFILE") and not any(
            k in config for k in ("access_key_id", "aws_access_key_id")):
        try:
            from obstore.auth.boto3 import Boto3CredentialProvider
        except ImportError:
            pass
        else:
            kwargs["credential_provider"] = Boto3CredentialProvider()
    if config:
        kwargs["config"] = config
    try:
        return from_url(location.root, **kwargs)
    except (BaseError, ValueError, TypeError) as exc:
        raise StorageError(f"cannot open {location.root}: {_first_line(exc)}") from None


class ObjectStorage:
    """Keys below ``location.prefix`` in one bucket or container."""

    is_local = False

    def __init__(self, location: Location, store: Any) -> None:
        self.location = location
        self._store = store
        self._obs = _obstore()

    @property
    def url(self) -> str:
        return self.location.url

    def local_path(self, key: str) -> None:
        return None

    def _key(self, key: str) -> str:
        return f"{self.location.prefix}/{key}" if self.location.prefix and key else \
            (key or self.location.prefix)

    def _call(self, what: str, key: str, op: Callable[[], T]) -> T:
        """``op`` with waits through an outage; obstore errors become rayorch's."""
        from obstore.exceptions import (
            AlreadyExistsError,
            GenericError,
            NotFoundError,
            PreconditionError,
        )

        deadline: float | None = None
        pause = 0.5
        while True:
            try:
                result = op()
            except (NotFoundError, AlreadyExistsError, PreconditionError):
                raise
            except GenericError as exc:
                patience = _patience_s()
                deadline = deadline or time.monotonic() + patience
                if time.monotonic() >= deadline:
                    raise StorageUnavailableError(
                        f"cannot {what} {self.url}/{key}: {_first_line(exc)} (for over "
                        f"{patience:.0f} s; $RAYORCH_STORAGE_PATIENCE_S)") from None
                _Outage.down(self.location.root, _first_line(exc), patience)
                time.sleep(pause)
                pause = min(pause * 2, 10.0)
                continue
            except Exception as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                raise StorageError(f"cannot {what} {self.url}/{key}: {_first_line(exc)}"
                                   ) from None
            if deadline is not None:
                _Outage.up(self.location.root)
            return result

    def create(self, key: str, data: bytes) -> bool:
        """Write ``key`` unless it exists (True), in one request; False when it exists."""
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            self._call("write", key, lambda: self._obs.put(
                self._store, self._key(key), data, mode="create", use_multipart=False))
        except (AlreadyExistsError, PreconditionError):
            return False
        return True

    def put(self, key: str, data: bytes) -> None:
        self._call("write", key, lambda: self._obs.put(
            self._store, self._key(key), data, mode="overwrite", use_multipart=False))

    def put_file(self, key: str, path: Path) -> None:
        """``path``'s bytes to ``key``, replacing it; a large file goes up in parts
        (multipart: the object appears whole or not at all), never read whole into memory."""
        self._call("write", key, lambda: self._obs.put(
            self._store, self._key(key), path, mode="overwrite"))

    def read(self, key: str) -> bytes:
        return bytes(self._call("read", key,
                                lambda: self._obs.get(self._store, self._key(key)).bytes()))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return bytes(self._call("read", key, lambda: self._obs.get_range(
            self._store, self._key(key), start=start, end=end)))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            meta = self._call("stat", key, lambda: self._obs.head(self._store, self._key(key)))
        except FileNotFoundError:
            return None
        return self._info(meta)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call("delete", key, lambda: self._obs.delete(self._store, self._key(key)))

    def _info(self, meta: Mapping[str, Any]) -> ObjectInfo:
        path = str(meta["path"])
        base = f"{self.location.prefix}/" if self.location.prefix else ""
        key = path[len(base):] if path.startswith(base) else path
        modified = meta.get("last_modified")
        return ObjectInfo(key, int(meta.get("size") or 0), meta.get("version") or None,
                          modified.timestamp() if modified is not None else None,
                          meta.get("e_tag") or None)

    def walk(self, folder: str = "") -> Iterator[list[ObjectInfo]]:
        """Every object below the folder key ``folder`` ("" = all), a page (up to 1,000
        keys, one request) at a time."""
        full = self._key(folder.strip("/")) or None
        stream = self._call("list", folder, lambda: iter(self._obs.list(
            self._store, full, chunk_size=PAGE)))
        while True:
            page = self._call("list", folder, lambda: next(stream, None))
            if page is None:
                return
            yield [self._info(meta) for meta in page]

    def names(self, prefix: str = "") -> Iterator[list[str]]:
        """Names of the objects directly below the root that start with ``prefix``, in key
        order, a page (one request) at a time: listed from just before ``prefix`` (S3's
        ``start-after``) and stopped past it, so a shard's parts cost no full listing."""
        base = f"{self.location.prefix}/" if self.location.prefix else ""
        offset = None
        if prefix:
            offset = base + prefix[:-1] + chr(ord(prefix[-1]) - 1)
        stream = self._call("list", prefix, lambda: iter(self._obs.list(
            self._store, self.location.prefix or None, offset=offset, chunk_size=PAGE)))
        while True:
            page = self._call("list", prefix, lambda: next(stream, None))
            if page is None:
                return
            keys = [str(meta["path"])[len(base):] for meta in page]
            mine = [k for k in keys if k.startswith(prefix) and "/" not in k]
            if mine:
                yield mine
            if prefix and keys and keys[-1] > prefix and not keys[-1].startswith(prefix):
                return

    def exists_dir(self) -> bool:
        return True  # prefixes need no creating on an object store

    def make_dir(self) -> None:
        return None

    def remove_empty_dirs(self, prefix: str = "") -> None:
        return None
