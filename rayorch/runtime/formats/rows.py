"""Records as rows of a declared schema, and back: what the typed formats share.

A present record's value is already its schema's normalized row (:meth:`RowSchema.normalize`),
so its canonical bytes are ``json_bytes(row)``; a row read back from any format gives those
same bytes again. A record that is not present (failed, dropped, suppressed) is a row with
``id``, ``status``/``outcome`` (its outcome), ``cause`` and ``output``; its other columns null.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import orjson

from rayorch.core.json_values import json_bytes
from rayorch.core.outcome import Outcome
from rayorch.runtime.formats import RECORD_COLUMNS, RowSchema
from rayorch.store.records.sink import SinkError, SinkRecord, check_record

PRESENT = Outcome.PRESENT.value


def from_json(obj: Any) -> Any:
    """A JSON value with ``{"$bytes": base64}`` turned back into ``bytes`` (for a binary
    column)."""
    if isinstance(obj, dict):
        if len(obj) == 1 and isinstance(obj.get("$bytes"), str):
            return base64.b64decode(obj["$bytes"])
        return {k: from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    return obj


def row_of(record: SinkRecord, schema: RowSchema, *, binary: bool = True) -> dict[str, Any]:
    """``record`` as one row of ``schema`` (``binary``: bytes as ``bytes``, else as JSON)."""
    if record.value_json is not None:
        value = orjson.loads(record.value_json)
        row = {name: value.get(name) for name in schema.columns}
        if binary:
            row = from_json(row)
        return {**row, "outcome": PRESENT, "output": None}
    row = dict.fromkeys(schema.columns)
    row.update({"id": record.index, "cause": record.cause})
    if "status" in row:
        row["status"] = record.outcome
    return {**row, "outcome": record.outcome, "output": record.output}


def record_of_row(row: dict[str, Any], where: str) -> SinkRecord:
    """The record one row read back holds (its columns in stored order); :class:`SinkError`
    when it is not a rayorch row."""
    index, outcome = row.get("id"), row.get("outcome")
    if type(index) is not int or not isinstance(outcome, str):
        raise SinkError(f"{where}: a row has no integer id or no outcome")
    if outcome == PRESENT:
        value = {k: v for k, v in row.items() if k not in RECORD_COLUMNS}
        try:
            rec = SinkRecord(index, outcome, json_bytes(value))
        except ValueError as exc:
            raise SinkError(f"{where}: the row of source {index} {exc}") from None
    else:
        cause, output = row.get("cause"), row.get("output")
        if not isinstance(cause, str | None) or not isinstance(output, str):
            raise SinkError(f"{where}: the row of source {index} has no cause or output")
        rec = SinkRecord(index, outcome, None, cause, output)
    check_record(rec, where)
    return rec


def rows_of(records: Iterable[SinkRecord], schema: RowSchema, *, binary: bool = True
            ) -> list[dict[str, Any]]:
    return [row_of(r, schema, binary=binary) for r in records]


__all__ = ["PRESENT", "from_json", "record_of_row", "row_of", "rows_of"]
