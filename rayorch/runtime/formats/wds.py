"""WebDataset parts: one tar per part; every sample of a format has the same members.

A sample's key is the source id (``%09d``). Without a schema its one member is
``<key>.json``, the record's line. With a schema (layout 2, docs/output-formats.md):

* ``<key>.json``: the row. A value held by a member is a marker string there,
  ``"$member:<ext>"``: the schema's text column (``"$member:md"``) and the ``data`` of each
  entry of its binary column (``"$member:<column>.mp"``);
* ``<key>.md``: the text column, UTF-8 (absent when the row has no text);
* ``<key>.<column>.mp``: the binary column's ``data``, one msgpack list aligned with the
  column's entries (``None`` where an entry has none), so a sample has one member for all
  its figures, however many: every sample of a tar has the same members (Hugging Face's
  ``webdataset`` loader requires it).

A schema whose binary column is *exploded* (``RowSchema.explode``: the video job's
``clips``) writes one sample per entry instead: key ``<key>_<entry %05d>``, members
``.json`` (the row with that one entry, and ``"$entry": {"column", "index"}``) and
``.<ext>`` (the entry's data: each clip in its container, ``.mp4``, ``.webm``, ``.mkv``...:
:data:`CONTAINERS`); a source without entries is one sample ``<key>`` with its json.

Members are written in that order with fixed metadata (mtime 0, owner 0): the same records
give the same bytes. Layout 1's ``{"$member": ext}`` markers (one member per figure) are
still read.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson

from rayorch.runtime.formats import RowSchema
from rayorch.runtime.formats.rows import record_of_row, row_of
from rayorch.store.records.sink import SinkError, SinkRecord, record_of_line

KEY_DIGITS = 9
ENTRY_DIGITS = 5
CONTAINERS = ("mp4", "webm", "mkv", "mov", "m4v", "avi")
"""Member extensions an exploded entry's data may take from its ``file`` name (a clip is
written in its source's container): what the bytes are, so readers decode them right."""
MARK = "$member:"
ENTRY = "$entry"
MEMBER = "$member"  # layout 1's marker dicts


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


def samples_of(record: SinkRecord, schema: RowSchema | None
               ) -> list[tuple[str, list[tuple[str, bytes]]]]:
    """The samples of one source: ``(key, [(extension, bytes), ...])`` each."""
    key = f"{record.index:0{KEY_DIGITS}d}"
    if schema is None:
        return [(key, [("json", record.line)])]
    row = row_of(record, schema)
    members: list[tuple[str, bytes]] = []
    if schema.text is not None and isinstance(row.get(schema.text), str):
        members.append(("md", row[schema.text].encode("utf-8")))
        row[schema.text] = f"{MARK}md"
    if schema.binary is None or not isinstance(row.get(schema.binary[0]), list):
        return [(key, [("json", orjson.dumps(row)), *members])]
    column, ext = schema.binary
    entries: list[Any] = row[column]
    if schema.explode == column and entries:
        samples = []
        for i, entry in enumerate(entries):
            data = entry.get("data") if isinstance(entry, dict) else None
            own = entry_extension(entry, ext)
            one = {**row, column: [_marked(entry, own if isinstance(data, bytes) else None)],
                   ENTRY: {"column": column, "index": i}}
            samples.append((f"{key}_{i:0{ENTRY_DIGITS}d}",
                            [("json", orjson.dumps(one)), *members,
                             *([(own, data)] if isinstance(data, bytes) else [])]))
        return samples
    mp = f"{column}.mp"
    datas = [e.get("data") if isinstance(e, dict) and isinstance(e.get("data"), bytes)
             else None for e in entries]
    row[column] = [_marked(e, mp if d is not None else None) for e, d in zip(entries, datas)]
    members.append((mp, msgpack.packb(datas, use_bin_type=True)))
    return [(key, [("json", orjson.dumps(row)), *members])]


def entry_extension(entry: Any, default: str) -> str:
    """The member extension of an exploded entry's data: its ``file``'s container
    (:data:`CONTAINERS`), else ``default``."""
    name = entry.get("file") if isinstance(entry, dict) else None
    suffix = name.rpartition(".")[2].lower() if isinstance(name, str) and "." in name else ""
    return suffix if suffix in CONTAINERS else default


def _marked(entry: Any, ext: str | None) -> Any:
    if not isinstance(entry, dict):
        return entry
    return {**entry, "data": None if ext is None else f"{MARK}{ext}"}


def sample_members(record: SinkRecord, schema: RowSchema | None) -> list[tuple[str, bytes]]:
    """The ``(member name, bytes)`` of one source's samples, in order."""
    return [(f"{key}.{ext}", data) for key, members in samples_of(record, schema)
            for ext, data in members]


def _tar_samples(tar: tarfile.TarFile, where: str) -> Iterator[tuple[str, dict[str, bytes]]]:
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


def _row(key: str, members: dict[str, bytes], where: str) -> dict[str, Any]:
    blob = members.get("json")
    if blob is None:
        raise SinkError(f"{where}: sample {key[:20]!r} has no json member")
    try:
        row: Any = orjson.loads(blob)
    except orjson.JSONDecodeError as exc:
        raise SinkError(f"{where}: sample {key[:20]!r}'s json is not JSON ({exc})") from None
    if not isinstance(row, dict):
        raise SinkError(f"{where}: sample {key[:20]!r}'s json is not an object")
    return row


def _member(ext: str, members: dict[str, bytes], key: str, where: str) -> bytes:
    data = members.get(ext)
    if data is None:
        raise SinkError(f"{where}: sample {key[:20]!r} names a member it lacks")
    return data


def _filled(row: dict[str, Any], members: dict[str, bytes], key: str, where: str
            ) -> dict[str, Any]:
    """``row`` with every marker replaced by what its member holds."""
    lists: dict[str, list[Any]] = {}

    def value(v: Any, position: int | None = None) -> Any:
        if isinstance(v, str) and v.startswith(MARK):
            ext = v[len(MARK):]
            data = _member(ext, members, key, where)
            if ext == "md":
                return data.decode("utf-8", errors="replace")
            if not ext.endswith(".mp"):
                return data
            if ext not in lists:
                try:
                    got = msgpack.unpackb(data, raw=False)
                except Exception as exc:  # msgpack's errors share no root
                    raise SinkError(f"{where}: sample {key[:20]!r}'s {ext} is not msgpack "
                                    f"({type(exc).__name__})") from None
                lists[ext] = got if isinstance(got, list) else []
            held = lists[ext]
            if position is None or position >= len(held):
                raise SinkError(f"{where}: sample {key[:20]!r}'s {ext} is too short")
            return held[position]
        if isinstance(v, dict):
            if len(v) == 1 and MEMBER in v:  # layout 1
                return _v1(v, members, key, where)
            return {k: value(x, position) for k, x in v.items()}
        if isinstance(v, list):
            return [value(x, i) for i, x in enumerate(v)]
        return v

    return {k: value(v) for k, v in row.items()}


def _v1(marker: dict[str, Any], members: dict[str, bytes], key: str, where: str) -> Any:
    ext = marker[MEMBER]
    if not isinstance(ext, str):
        raise SinkError(f"{where}: sample {key[:20]!r} names a member it lacks")
    data = _member(ext, members, key, where)
    return data.decode("utf-8", errors="replace") if ext == "md" else data


def _records(tar: tarfile.TarFile, where: str) -> Iterator[SinkRecord]:
    """The records of a tar: a sample each, or a run of entry samples (``<key>_<i>``)."""
    group: tuple[str, str, dict[str, Any]] | None = None  # source key, column, row so far
    for key, members in _tar_samples(tar, where):
        source, _, entry = key.partition("_")
        row = _row(key, members, where)
        if group is not None and (not entry or source != group[0]):
            yield record_of_row(group[2], where)
            group = None
        if not entry:
            if "index" in row:  # no schema: the record's line
                yield record_of_line(members["json"], where)
            else:
                yield record_of_row(_filled(row, members, key, where), where)
            continue
        mark = row.pop(ENTRY, None)
        column = mark.get("column") if isinstance(mark, dict) else None
        position = mark.get("index") if isinstance(mark, dict) else None
        if not (isinstance(column, str) and isinstance(position, int)
                and isinstance(row.get(column), list) and len(row[column]) == 1):
            raise SinkError(f"{where}: sample {key[:20]!r} is an entry of no column")
        filled = _filled(row, members, key, where)
        if group is None:
            if position != 0:
                raise SinkError(f"{where}: sample {key[:20]!r} is out of order")
            group = (source, column, filled)
            continue
        if position != len(group[2][column]) or column != group[1]:
            raise SinkError(f"{where}: sample {key[:20]!r} is out of order")
        group[2][column].append(filled[column][0])
    if group is not None:
        yield record_of_row(group[2], where)


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
                return list(_records(tar, where))
        except tarfile.TarError as exc:
            raise SinkError(f"{where} is not a readable tar file ({exc})") from None


WDS = WebDataset()

__all__ = ["CONTAINERS", "WDS", "entry_extension", "sample_members", "samples_of"]
