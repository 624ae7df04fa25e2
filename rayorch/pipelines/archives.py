"""Archives as inputs: a ``.zip``, ``.tar``, ``.tar.gz`` or ``.tgz`` whose members are sources.

A member's source name is ``ARCHIVE#MEMBER`` (``s3://b/shards/07.zip#papers/a.pdf``). The
listing expands an archive into its members (:func:`list_members`): a zip by its central
directory (ranged reads at its end on an object store), a tar by streaming its headers. The
actor that renders a member reads it (:func:`read_member`): from a zip, the member's bytes by
ranged reads; from a tar, the archive streamed up to the member (a ``.tar.gz`` has no index).
Nothing is extracted to local disk. A member that cannot be read (a bad CRC, a damaged
stream) fails alone (``damaged``); one not in the archive, ``missing``.
"""

from __future__ import annotations

import tarfile
import zipfile
import zlib
from collections.abc import Collection, Iterator
from pathlib import PurePosixPath
from typing import IO

from rayorch.core.errors import RayorchError
from rayorch.core.outcome import RecordFailure
from rayorch.pipelines.sources import Listed, paged, refuse

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
"""Names that are archives (lower case)."""
LISTED_SUFFIXES = frozenset({".zip", ".tar", ".tgz", ".gz"})
"""What a listing keeps for archives (``.gz``: then checked to be ``.tar.gz``)."""
SEPARATOR = "#"


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def split_member(name: str) -> tuple[str, str] | None:
    """``(archive, member)`` of an ``ARCHIVE#MEMBER`` source name, else None."""
    lower = name.lower()
    for suffix in ARCHIVE_SUFFIXES:
        at = lower.find(suffix + SEPARATOR)
        if at > 0:
            cut = at + len(suffix)
            return name[:cut], name[cut + 1:]
    return None


def _open(url: str) -> IO[bytes]:
    from rayorch.pipelines.input_lists import open_input

    return open_input(url, what="archive")


def _wanted(member: str, suffixes: Collection[str]) -> bool:
    return PurePosixPath(member).suffix.lower() in suffixes


def list_members(archive: Listed, suffixes: Collection[str]) -> Iterator[list[Listed]]:
    """The members of ``archive`` whose suffix is one of ``suffixes``, a page at a time, in
    archive order; each member's identity is the archive's and the member's (its CRC or
    offset). A damaged archive is a ``RayorchError`` naming it."""
    try:
        yield from paged(_members(archive, suffixes))
    except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError) as exc:
        raise RayorchError(f"the archive {archive.name} cannot be listed: "
                           f"{' '.join(str(exc).split())[:300]}") from None


def _members(archive: Listed, suffixes: Collection[str]) -> Iterator[Listed]:
    """The archive's wanted members, in archive order, as they are read."""
    with _open(archive.name) as raw:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(raw) as zipped:
                for info in zipped.infolist():
                    if not info.is_dir() and _wanted(info.filename, suffixes):
                        yield Listed(f"{archive.name}{SEPARATOR}{info.filename}",
                                     info.file_size, f"{archive.identity}/{info.CRC:08x}")
        else:
            with tarfile.open(fileobj=raw, mode="r|*") as tar:
                for member in tar:
                    if member.isfile() and _wanted(member.name, suffixes):
                        yield Listed(f"{archive.name}{SEPARATOR}{member.name}", member.size,
                                     f"{archive.identity}/{member.offset}")


def read_member(name: str) -> bytes:
    """The bytes of the member ``ARCHIVE#MEMBER`` names; ``RecordFailure`` (missing,
    damaged, unreadable) for this source alone."""
    parts = split_member(name)
    if parts is None:
        raise refuse("bad input", f"{name} names no archive member")
    archive, member = parts
    try:
        raw = _open(archive)
    except RayorchError as exc:
        raise refuse("missing", str(exc)) from None
    try:
        with raw:
            if archive.lower().endswith(".zip"):
                with zipfile.ZipFile(raw) as zipped:
                    try:
                        return zipped.read(member)
                    except KeyError:
                        raise refuse("missing", f"{archive} holds no member {member}") from None
            with tarfile.open(fileobj=raw, mode="r|*") as tar:
                for entry in tar:
                    if entry.name == member and entry.isfile():
                        data = tar.extractfile(entry)
                        if data is None:
                            break
                        return data.read()
            raise refuse("missing", f"{archive} holds no member {member}")
    except RecordFailure:
        raise
    except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError,
            ValueError) as exc:
        raise refuse("damaged", f"{name}: {exc}") from None


__all__ = ["ARCHIVE_SUFFIXES", "LISTED_SUFFIXES", "is_archive", "list_members", "read_member",
           "split_member"]
