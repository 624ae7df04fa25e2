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

PART_RE = re.compile(r"^part-s(\d{5,})-(\d{12,})-(\d+)-(?:q(\d+)-)?([0-9a-f]{6}|[0-9a-f]{16})"
                     r"\.([a-z0-9]+(?:\.[a-z0-9]+)?)$")
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


def check_record(rec: SinkRecord, where: str) -> None:
    if rec.index < 0 or rec.outcome not in OUTCOMES or (
            (rec.value_json is None) != (rec.outcome != Outcome.PRESENT.value)):
        raise SinkError(f"{where}: record of source {rec.index} is not a rayorch record")


def record_of_line(line: bytes, where: str) -> SinkRecord:
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
    check_record(rec, where)
    return rec


# -- part files -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PartName:
    shard: int
    first: int
    count: int
    suffix: str  # the format's (rayorch.runtime.formats): jsonl, parquet, jsonl.zst, tar
    acked: int = 0  # the shard's facts the store had acknowledged to its writer (0: unknown)

    @classmethod
    def parse(cls, name: str) -> PartName | None:
        m = PART_RE.match(name)
        if m is None:
            return None
        return cls(int(m[1]), int(m[2]), int(m[3]), m[6], int(m[4] or 0))

    @staticmethod
    def new(shard: int, records: Sequence[SinkRecord], suffix: str, acked: int = 0, *,
            by_content: bool = False) -> str:
        """A new part's name: its tag random (6 hex), or ``by_content`` the first 16 hex of
        the SHA-256 of its records' digests (a rolled shard: the same records, the same
        name, so a retried publish finds its own part)."""
        first = min(r.index for r in records)
        seq = f"q{acked}-" if acked else ""
        tag = secrets.token_hex(3) if not by_content else hashlib.sha256(
            "".join(r.digest for r in records).encode()).hexdigest()[:16]
        return f"part-s{shard:05d}-{first:012d}-{len(records)}-{seq}{tag}.{suffix}"


__all__ = ["OUTCOMES", "PART_RE", "PartName", "SinkError", "SinkRecord", "check_record",
           "encode_record", "record_of_line"]
