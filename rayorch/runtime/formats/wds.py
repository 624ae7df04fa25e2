"""WebDataset parts: one tar per part, one sample per source.

A sample's key is the source id (``%09d``). With a schema its members are ``<key>.json``
(the row), ``<key>.md`` (the schema's text column, UTF-8) and ``<key>.<i>.<ext>`` (the
``data`` of the i-th entry of its binary column, e.g. each figure's PNG); in the row, a
value held by a member is ``{"$member": "<ext>"}`` (a string or binary column never holds
a dict). Without a schema, ``<key>.json`` is the record's line. Members are written in that
order with fixed metadata (mtime 0, owner 0): the same records give the same bytes.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rayorch.runtime.formats import RowSchema
from rayorch.runtime.formats.rows import record_of_row, row_of
from rayorch.store.records.sink import SinkError, SinkRecord, record_of_line

KEY_DIGITS = 9
MEMBER = "$member"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


def sample_members(record: SinkRecord, schema: RowSchema | None) -> list[tuple[str, bytes]]:
    """The ``(member name, bytes)`` of one source's sample."""
    key = f"{record.index:0{KEY_DIGITS}d}"
    if schema is None:
        return [(f"{key}.json", record.line)]
    row = row_of(record, schema)
    members: list[tuple[str, bytes]] = []
    if schema.text is not None and isinstance(row.get(schema.text), str):
        members.append((f"{key}.md", row[schema.text].encode("utf-8")))
        row[schema.text] = {MEMBER: "md"}
    if schema.binary is not None and isinstance(row.get(schema.binary[0]), list):
        column, ext = schema.binary
        entries = []
        for i, entry in enumerate(row[column]):
            if isinstance(entry, dict) and isinstance(entry.get("data"), bytes):
                members.append((f"{key}.{i}.{ext}", entry["data"]))
                entry = {**entry, "data": {MEMBER: f"{i}.{ext}"}}
            entries.append(entry)
        row[column] = entries
    return [(f"{key}.json", orjson.dumps(row)), *members]


def _samples(tar: tarfile.TarFile, where: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    key: str | None = None
    members: dict[str, bytes] = {}
    for info in tar:
        if not info.isfile():
            continue
        stem, dot, ext = info.name.partition(".")
        if not dot or "/" in info.name:
            raise SinkError(f"{where}: member {info.name[:60]!r} is not a sample's")
        handle = tar.extractfile(info)
        data = handle.read() if handle is not None else b""
        if stem != key:
            if key is not None:
                yield key, members
            key, members = stem, {}
        members[ext] = data
    if key is not None:
        yield key, members


def _record(key: str, members: dict[str, bytes], where: str) -> SinkRecord:
    blob = members.get("json")
    if blob is None:
        raise SinkError(f"{where}: sample {key[:20]!r} has no json member")
    try:
        row: Any = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise SinkError(f"{where}: sample {key[:20]!r}'s json is not JSON ({exc})") from None
    if not isinstance(row, dict):
        raise SinkError(f"{where}: sample {key[:20]!r}'s json is not an object")
    if "index" in row:
        return record_of_line(blob, where)
    return record_of_row(_filled(row, members, key, where), where)


def _filled(value: Any, members: dict[str, bytes], key: str, where: str) -> Any:
    """``value`` with each ``{"$member": ext}`` replaced by that member (``md``: as text)."""
    if isinstance(value, dict):
        if len(value) == 1 and MEMBER in value:
            ext = value[MEMBER]
            if not isinstance(ext, str) or ext not in members:
                raise SinkError(f"{where}: sample {key[:20]!r} names a member it lacks")
            data = members[ext]
            return data.decode("utf-8", errors="replace") if ext == "md" else data
        return {k: _filled(v, members, key, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_filled(v, members, key, where) for v in value]
    return value


@dataclass(frozen=True)
class WebDataset:
    name: str = "wds"
    suffix: str = "tar"
    needs: str | None = None

    def encode(self, records: Sequence[SinkRecord], schema: RowSchema | None) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for record in records:
                for name, data in sample_members(record, schema):
                    _add(tar, name, data)
        return buffer.getvalue()

    def decode(self, data: bytes, where: str) -> list[SinkRecord]:
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                return [_record(key, members, where) for key, members in _samples(tar, where)]
        except tarfile.TarError as exc:
            raise SinkError(f"{where} is not a readable tar file ({exc})") from None


WDS = WebDataset()

__all__ = ["WDS", "sample_members"]
