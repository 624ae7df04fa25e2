"""Parquet parts: typed columns of a declared schema, or the generic record columns.

With a :class:`RowSchema` a part holds one row per source in the schema's columns (then
``outcome`` and ``output``), zstd-compressed, its schema's name and version in the file's
metadata (``rayorch_schema``). Without one (any ``Pipeline``'s outputs), the columns are
``index:int64, outcome, value_json, cause, output``: the value as one JSON string.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayorch.runtime.formats import RowSchema
from rayorch.runtime.formats.rows import record_of_row, rows_of
from rayorch.store.records.sink import SinkError, SinkRecord, check_record

RECORD_COLUMNS = ["index", "outcome", "value_json", "cause", "output"]
ROW_GROUP = 1024


def _record_table(records: Sequence[SinkRecord]) -> Any:
    import pyarrow as pa

    return pa.table({
        "index": pa.array([r.index for r in records], pa.int64()),
        "outcome": pa.array([r.outcome for r in records], pa.string()),
        "value_json": pa.array([None if r.value_json is None else r.value_json.decode()
                                for r in records], pa.string()),
        "cause": pa.array([r.cause for r in records], pa.string()),
        "output": pa.array([r.output for r in records], pa.string()),
    })


def _records_of_record_table(table: Any, where: str) -> list[SinkRecord]:
    out = []
    for row in table.to_pylist():
        index, outcome, value_json = row["index"], row["outcome"], row["value_json"]
        if not isinstance(index, int) or not isinstance(outcome, str):
            raise SinkError(f"{where}: a row has no index or outcome")
        if isinstance(value_json, str):
            value_json = value_json.encode()
        rec = SinkRecord(index, outcome, value_json, row["cause"], row["output"])
        check_record(rec, where)
        out.append(rec)
    return out


@dataclass(frozen=True)
class Parquet:
    name: str = "parquet"
    suffix: str = "parquet"
    needs: str | None = "parquet"

    def encode(self, records: Sequence[SinkRecord], schema: RowSchema | None) -> bytes:
        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        if schema is None:
            pq.write_table(_record_table(records), buffer)
        else:
            try:
                table = pa.Table.from_pylist(rows_of(records, schema), schema=schema.arrow)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise SinkError(f"the rows do not fit the {schema.name} schema: {exc}") \
                    from None
            pq.write_table(table, buffer, compression="zstd", row_group_size=ROW_GROUP)
        return buffer.getvalue()

    def decode(self, data: bytes, where: str) -> list[SinkRecord]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(pa.BufferReader(data))
        except pa.ArrowException as exc:
            raise SinkError(f"{where} is not a readable Parquet file ({exc})") from None
        if table.column_names == RECORD_COLUMNS:
            return _records_of_record_table(table, where)
        if not {"id", "outcome", "output"} <= set(table.column_names):
            raise SinkError(f"{where} has columns {table.column_names}, not a rayorch part's")
        return [record_of_row(row, where) for row in table.to_pylist()]


PARQUET = Parquet()

__all__ = ["PARQUET"]
