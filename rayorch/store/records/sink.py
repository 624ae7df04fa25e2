"""A file sink's records and part names: encoding one source's record, reading a part.

The writer and its rules are in :mod:`rayorch.runtime.sinks` (which re-exports these).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rayorch.core.errors import RayorchError
from rayorch.core.json_values import json_bytes
from rayorch.core.outcome import FailedResult, Outcome

PART_RE = re.compile(
    r"^part-s(\d{5,})-(\d{12,})-(\d+)-(?:q(\d+)-)?([0-9a-f]{6})\.(jsonl|parquet)$")
OUTCOMES = frozenset(o.value for o in Outcome)


class SinkError(RayorchError):
    """A sink directory, part file or value cannot be used; the message says which."""


# -- records ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SinkRecord:
    """One source's record: its canonical bytes (a JSONL line) and its parts."""

    index: int
    outcome: str
    value_json: bytes | None  # present only
    cause: str | None = None
    output: str | None = None
    stored: bytes | None = None  # the line as read from a JSONL part (kept byte for byte)

    @property
    def line(self) -> bytes:
        if self.stored is not None:
            return self.stored
        if self.value_json is not None:
            return b'{"index":%d,"outcome":"present","value":%s}' % (self.index, self.value_json)
        return b'{"index":%d,"outcome":%s,"cause":%s,"output":%s}' % (
            self.index, orjson.dumps(self.outcome), orjson.dumps(self.cause),
            orjson.dumps(self.output))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.line).hexdigest()

    def as_dict(self) -> dict[str, Any]:
        if self.value_json is not None:
            return {"index": self.index, "outcome": self.outcome,
                    "value": orjson.loads(self.value_json)}
        return {"index": self.index, "outcome": self.outcome, "cause": self.cause,
                "output": self.output}


def encode_record(index: int, value: Any) -> SinkRecord:
    """The record of source ``index`` (its output, or a :class:`FailedResult`)."""
    if isinstance(value, FailedResult):
        return SinkRecord(index, value.outcome.value, None, value.cause, value.port)
    try:
        blob = json_bytes(value)
    except ValueError as exc:
        raise SinkError(f"source {index}: its output {exc}") from None
    return SinkRecord(index, Outcome.PRESENT.value, blob)


def _check_shape(rec: SinkRecord, where: str) -> None:
    if rec.index < 0 or rec.outcome not in OUTCOMES or (
            (rec.value_json is None) != (rec.outcome != Outcome.PRESENT.value)):
        raise SinkError(f"{where}: record of source {rec.index} is not a rayorch record")


def _record_of_line(line: bytes, where: str) -> SinkRecord:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise SinkError(f"{where}: a line is not JSON ({exc})") from None
    if not isinstance(obj, dict) or type(obj.get("index")) is not int:
        raise SinkError(f"{where}: a line is not a rayorch record (no integer index)")
    if obj.get("outcome") == Outcome.PRESENT.value and set(obj) == {"index", "outcome", "value"}:
        rec = SinkRecord(obj["index"], "present", orjson.dumps(obj["value"]), stored=line)
    elif set(obj) == {"index", "outcome", "cause", "output"} and isinstance(
            obj["outcome"], str) and isinstance(obj["cause"], str | None) and isinstance(
            obj["output"], str):
        rec = SinkRecord(obj["index"], obj["outcome"], None, obj["cause"], obj["output"],
                         stored=line)
    else:
        raise SinkError(f"{where}: the record of source {obj['index']} has keys {sorted(obj)}")
    _check_shape(rec, where)
    return rec


# -- part files -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PartName:
    shard: int
    first: int
    count: int
    fmt: str
    acked: int = 0  # the shard's facts the store had acknowledged to its writer (0: unknown)

    @classmethod
    def parse(cls, name: str) -> PartName | None:
        m = PART_RE.match(name)
        if m is None:
            return None
        return cls(int(m[1]), int(m[2]), int(m[3]), m[6], int(m[4] or 0))

    @staticmethod
    def new(shard: int, records: Sequence[SinkRecord], fmt: str, acked: int = 0) -> str:
        first = min(r.index for r in records)
        seq = f"q{acked}-" if acked else ""
        return (f"part-s{shard:05d}-{first:012d}-{len(records)}-{seq}{secrets.token_hex(3)}"
                f".{fmt}")


def parse_part(where: str, fmt: str, data: bytes) -> list[tuple[SinkRecord, str]]:
    """The records of one part's bytes (``fmt``: jsonl or parquet) with their digests (of
    the bytes as stored); ``where`` names the part in errors."""
    if fmt == "jsonl":
        recs = [_record_of_line(line, where) for line in data.splitlines() if line]
    else:
        recs = _read_parquet(data, where)
    return [(rec, rec.digest) for rec in recs]


def _read_parquet(data: bytes, where: str) -> list[SinkRecord]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(pa.BufferReader(data))
    except pa.ArrowException as exc:
        raise SinkError(f"{where} is not a readable Parquet file ({exc})") from None
    if table.column_names != ["index", "outcome", "value_json", "cause", "output"]:
        raise SinkError(f"{where} has columns {table.column_names}, not a rayorch part's")
    out = []
    for row in table.to_pylist():
        index, outcome, value_json = row["index"], row["outcome"], row["value_json"]
        if not isinstance(index, int) or not isinstance(outcome, str):
            raise SinkError(f"{where}: a row has no index or outcome")
        if isinstance(value_json, str):
            value_json = value_json.encode()
        rec = SinkRecord(index, outcome, value_json, row["cause"], row["output"])
        _check_shape(rec, where)
        out.append(rec)
    return out


__all__ = ["OUTCOMES", "PART_RE", "PartName", "SinkError", "SinkRecord", "encode_record",
           "parse_part"]
