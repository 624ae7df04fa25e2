"""A sink's layout on its storage: manifest, part files, claim markers, hidden temp files.

The primitives every reader and writer of a sink shares (the layout itself is described
in :mod:`rayorch.runtime.sinks`): the names of the manifest and of the hidden files,
reading and writing the manifest, publishing a part whole (a conditional create, never
over an existing object), reading a part back with its records' digests, and listing the
live parts (those no claim marker discards). :class:`~rayorch.runtime.sinks.FileSink`
writes through them; ``read_outputs``, the audit (``sink_audit.py``), the index
(``formats/index.py``) and a run taking a sink over (``sink_takeover.py``) read through them.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
import secrets
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from rayorch.runtime.formats import RowSchema, format_names, format_of_suffix, part_format
from rayorch.storage import Storage, StorageError, open_storage, parse_location
from rayorch.store.records.sink import PartName, SinkError, SinkRecord

SINK_MANIFEST = "_rayorch_sink.json"
SINK_VERSION = 1
HIDDEN_PREFIX = ".rayorch-"  # temp files and claim markers: ignored by readers
# A local temp file (being written), or a claim file of rayorch before object storage:
# "<prefix>tmp-<part>-<8 hex>" / "<prefix>claim-<part>-<8 hex>".
LEFTOVER_RE = re.compile(rf"^{re.escape(HIDDEN_PREFIX)}(?:tmp|claim)-(?P<part>.+)-[0-9a-f]{{8}}$")
# A part's claim marker: "<prefix>claim-<part>", holding ADOPT or DISCARD (see FileSink.adopt).
CLAIM_PREFIX = f"{HIDDEN_PREFIX}claim-"
ADOPT, DISCARD = b"adopt", b"discard"


def sink_url(out_dir: str | Path) -> str:
    """The canonical form of a sink location, as recorded with a run: an absolute path, or
    the URL (``s3://bucket/prefix``)."""
    location = parse_location(out_dir)
    return str(Path(location.root).resolve()) if location.is_local else location.url


def read_part(storage: Storage, name: str) -> list[tuple[SinkRecord, str]]:
    """The records of part ``name`` with their digests; :class:`FileNotFoundError` when
    it is gone, :class:`SinkError` when it cannot be read or parsed."""
    where = f"part file {storage.url}/{name}"
    part = PartName.parse(name)
    fmt = format_of_suffix(part.suffix if part else name.partition(".")[2])
    if fmt is None:
        raise SinkError(f"{where} is in no known format")
    try:
        data = storage.read(name)
    except StorageError as exc:
        raise SinkError(f"{where} cannot be read: {exc}") from None
    return [(rec, rec.digest) for rec in part_format(fmt).decode(data, where)]


def list_names(storage: Storage, prefix: str) -> list[str]:
    """Every name directly in the sink starting with ``prefix`` (sorted)."""
    try:
        return [name for page in storage.names(prefix) for name in page]
    except StorageError as exc:
        raise SinkError(f"cannot list {storage.url}: {exc}") from None


def part_claims(storage: Storage, part_prefix: str) -> dict[str, bytes]:
    """The claim markers of parts named ``part_prefix...``: part name -> ADOPT | DISCARD."""
    out: dict[str, bytes] = {}
    for marker in list_names(storage, CLAIM_PREFIX + part_prefix):
        part = marker[len(CLAIM_PREFIX):]
        if PartName.parse(part) is None:
            continue
        try:
            out[part] = storage.read(marker).strip()
        except FileNotFoundError:
            continue
        except StorageError as exc:
            raise SinkError(f"cannot read {storage.url}/{marker}: {exc}") from None
    return out


def live_parts(storage: Storage, part_prefix: str = "part-") -> list[str]:
    """The part names (sorted) starting with ``part_prefix`` that are not discarded."""
    discarded = {p for p, body in part_claims(storage, part_prefix).items() if body == DISCARD}
    return [n for n in list_names(storage, part_prefix)
            if PartName.parse(n) is not None and n not in discarded]

def _new_suffix(name: str) -> str:
    """``name`` with another random 6-hex suffix (a part name clashed)."""
    stem, _, ext = name.rpartition("-")
    return f"{stem}-{secrets.token_hex(3)}.{ext.partition('.')[2]}"


def publish(storage: Storage, name: str, data: bytes, *, rename_on_clash: bool = True,
            replace: bool = False) -> str:
    """Write ``name`` whole or not at all, never over an existing object (a conditional
    create: ``link`` on a local disk, ``If-None-Match: *`` on S3, ...); the name used.

    A clash picks another random suffix; without ``rename_on_clash`` it raises
    :class:`FileExistsError`. ``replace`` replaces an existing object instead, in one
    atomic write (the manifest of a run taking a sink over).
    """
    try:
        if replace:
            storage.put(name, data)
            return name
        for _ in range(8):
            if storage.create(name, data):
                return name
            if not rename_on_clash:
                raise FileExistsError(name)
            name = _new_suffix(name)
    except StorageError as exc:
        raise SinkError(f"cannot write part file {name}: {exc}") from None
    raise SinkError(f"cannot find a free part name in {storage.url}")  # pragma: no cover


def write_part_file(storage: Storage, fmt: str, name: str, records: Sequence[SinkRecord],
                    schema: RowSchema | None = None) -> str:
    """Encode ``records`` as a part of format ``fmt`` and :func:`publish` it as ``name``;
    the name used."""
    return publish(storage, name, part_format(fmt).encode(records, schema))

def load_manifest(storage: Storage) -> dict[str, Any] | None:
    """The sink's manifest, checked; None when there is none (a new sink)."""
    try:
        blob = storage.read(SINK_MANIFEST)
    except FileNotFoundError:
        return None
    except StorageError as exc:
        raise SinkError(f"{storage.url}/{SINK_MANIFEST} cannot be read: {exc}") from None
    try:
        meta = orjson.loads(blob)
    except orjson.JSONDecodeError:
        meta = None
    if not (isinstance(meta, dict) and meta.get("rayorch_sink") == SINK_VERSION
            and isinstance(meta.get("run"), str) and meta.get("format") in format_names()):
        raise SinkError(f"{storage.url}/{SINK_MANIFEST} is not a rayorch sink manifest "
                        f"(version {SINK_VERSION}); use another directory")
    return meta


def manifest_bytes(meta: dict[str, Any]) -> bytes:
    """The bytes of manifest ``meta`` as stored (indented, keys sorted)."""
    return orjson.dumps(meta, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)


def foreign_files(storage: Storage, fmt: str | None, beside: Sequence[str] = ()) -> list[str]:
    """Names in the sink's first listing page (up to 1,000: the check costs one request)
    that are neither its parts, its manifest, hidden, nor allowed ``beside`` them."""
    odd = []
    try:
        first: list[str] = next(iter(storage.names("")), [])
    except StorageError as exc:
        raise SinkError(f"cannot list {storage.url}: {exc}") from None
    for name in first:
        if name == SINK_MANIFEST or name.startswith(HIDDEN_PREFIX) or any(
                fnmatch.fnmatchcase(name, pattern) for pattern in beside):
            continue
        part = PartName.parse(name)
        if part is None or (fmt is not None and part.suffix != part_format(fmt).suffix):
            odd.append(name)
    return sorted(odd)


def sink_parts(out_dir: str | Path | Storage) -> tuple[Storage, dict[str, Any], list[str]]:
    """A sink's storage, manifest and live part names (sorted)."""
    try:
        storage = out_dir if not isinstance(out_dir, str | Path) else open_storage(out_dir)
        exists = storage.exists_dir()
    except StorageError as exc:
        raise SinkError(str(exc)) from None
    if not exists:
        raise SinkError(f"{storage.url} is not a directory")
    meta = load_manifest(storage)
    if meta is None:
        raise SinkError(f"{storage.url} is not a rayorch output directory (no {SINK_MANIFEST})")
    odd = foreign_files(storage, meta["format"], meta.get("beside", ()))
    if odd:
        raise SinkError(f"{storage.url} holds files that are not {meta['format']} part files "
                        f"({', '.join(odd[:3])})")
    return storage, meta, live_parts(storage)


def read_parts(storage: Storage, names: Sequence[str], *, threads: int = 8, ahead: int = 32
               ) -> Iterator[tuple[str, list[tuple[SinkRecord, str]]]]:
    """``(name, read_part(name))`` in the order of ``names``, up to ``ahead`` parts read
    ahead on ``threads`` threads (an object store answers each read in milliseconds: one
    at a time, a sink of many small parts takes seconds to read back)."""
    if not names:
        return
    with ThreadPoolExecutor(min(threads, len(names)), thread_name_prefix="rayorch-read") \
            as pool:
        pending = iter(names)
        window = deque((n, pool.submit(read_part, storage, n))
                       for n in itertools.islice(pending, ahead))
        while window:
            name, future = window.popleft()
            if (following := next(pending, None)) is not None:
                window.append((following, pool.submit(read_part, storage, following)))
            yield name, future.result()


__all__ = ["ADOPT", "CLAIM_PREFIX", "DISCARD", "HIDDEN_PREFIX", "LEFTOVER_RE", "SINK_MANIFEST",
           "SINK_VERSION", "foreign_files", "list_names", "live_parts", "load_manifest",
           "manifest_bytes", "part_claims", "publish", "read_part", "read_parts", "sink_parts",
           "sink_url", "write_part_file"]
