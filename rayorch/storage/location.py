"""What a storage URL names: its scheme, the extra that serves it, a printable form.

Every place rayorch reads or writes bytes takes one of these (docs/topics/STORAGE.md, "Storage
is a URL"): ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix`` (also
``abfs://``, ``abfss://``, ``azure://``), ``file:///abs/path`` or a plain path. A scheme
nothing serves is refused: it is never taken as a local path (``s3:/x`` would be).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from rayorch.core.errors import RayorchError


class StorageError(RayorchError):
    """Reading or writing a storage URL failed; says which object and why."""


class StorageUnavailableError(StorageError):
    """The object store did not answer for longer than rayorch waits for it."""


# scheme -> (kind, the rayorch extra that installs its client)
SCHEMES: dict[str, tuple[str, str]] = {
    "s3": ("s3", "s3"), "s3a": ("s3", "s3"),
    "gs": ("gcs", "gcs"), "gcs": ("gcs", "gcs"),
    "az": ("azure", "azure"), "azure": ("azure", "azure"), "abfs": ("azure", "azure"),
    "abfss": ("azure", "azure"), "adl": ("azure", "azure"),
}
_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):")


@dataclass(frozen=True)
class Location:
    """A parsed storage URL. ``kind``: ``local``, ``s3``, ``gcs`` or ``azure``.

    For ``local``, ``root`` is the directory; otherwise ``root`` is the URL of the bucket
    (or container) and ``prefix`` the key prefix inside it, without slashes at its ends.
    """

    kind: str
    root: str
    prefix: str = ""
    extra: str = ""

    @property
    def is_local(self) -> bool:
        return self.kind == "local"

    @property
    def url(self) -> str:
        """The location as a URL to print or record: no credentials, no query."""
        if self.is_local:
            return self.root
        return f"{self.root}/{self.prefix}" if self.prefix else self.root

    def join(self, *names: str) -> Location:
        """The location of ``names`` below this one (each a relative key: no ``..``)."""
        parts = [check_key(n) for n in names if n]
        if self.is_local:
            return Location("local", str(Path(self.root, *parts)))
        prefix = "/".join([p for p in [self.prefix, *parts] if p])
        return Location(self.kind, self.root, prefix, self.extra)

    def name(self) -> str:
        """The last component (a file's or object's name)."""
        if self.is_local:
            return Path(self.root).name
        return self.prefix.rpartition("/")[2]

    def parent(self) -> Location:
        if self.is_local:
            return Location("local", str(Path(self.root).parent))
        return Location(self.kind, self.root, self.prefix.rpartition("/")[0], self.extra)

    def __str__(self) -> str:
        return self.url


def check_key(name: str) -> str:
    """A relative key (``a/b.md``): refused when absolute or when it climbs (``..``)."""
    if name.startswith("/") or any(p in ("..", ".") for p in name.split("/")) or "\\" in name \
            or "\x00" in name:
        raise StorageError(f"{name!r} is not a relative storage key (no leading /, no '..')")
    return name.strip("/")


def parse_location(url: str | Path | Location) -> Location:
    """The :class:`Location` of a URL or path; :class:`StorageError` for an unknown scheme."""
    if isinstance(url, Location):
        return url
    if isinstance(url, Path):
        return Location("local", str(url))
    text = str(url)
    if not text:
        raise StorageError("an empty storage location: pass a path or a URL (s3://bucket/prefix)")
    match = _SCHEME.match(text)
    if match is None or (len(match["scheme"]) == 1 and text[1:3] in (":\\", ":/")):
        return Location("local", text)  # a plain path (or a Windows drive letter)
    scheme = match["scheme"].lower()
    if scheme == "file":
        parts = urlsplit(text)
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"{_printable(text)}: a file:// URL names a local path "
                               "(file:///abs/path), not a host")
        return Location("local", unquote(parts.path) or "/")
    if scheme not in SCHEMES:
        known = ", ".join(sorted({f"{s}://" for s in SCHEMES} | {"file://"}))
        raise StorageError(f"{_printable(text)}: no storage serves the scheme {scheme!r}; "
                           f"use a local path or one of {known}")
    kind, extra = SCHEMES[scheme]
    parts = urlsplit(text)
    if parts.query or parts.fragment:
        raise StorageError(f"{_printable(text)}: a storage URL takes no query or fragment; "
                           "pass settings with --storage-option KEY=VALUE")
    bucket = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc and kind != "azure":
        raise StorageError(f"{scheme}://…: credentials do not belong in the URL; use the "
                           "cloud's standard configuration or --storage-option")
    if not bucket:
        raise StorageError(f"{_printable(text)}: the URL names no bucket ({scheme}://BUCKET/…)")
    prefix = "/".join(check_key(p) for p in unquote(parts.path).split("/") if p)
    netloc = parts.netloc if kind == "azure" else bucket
    return Location(kind, f"{scheme}://{netloc}", prefix, extra)


def _printable(text: str) -> str:
    """A URL as it may be printed: no user info, no query, at most 200 characters."""
    parts = urlsplit(text)
    host = parts.netloc.rpartition("@")[2]
    shown = f"{parts.scheme}://{host}{parts.path}" if parts.scheme else text
    return shown[:200]


__all__ = ["Location", "SCHEMES", "StorageError", "StorageUnavailableError", "check_key",
           "parse_location"]
