"""``_index.parquet``: where each source of a sink is, part by part.

One row per record: ``id`` (the source index), ``source`` (its row's ``source`` when the
value has one), ``outcome``, ``shard`` (the part's name) and ``row`` (its position in the
part). Built from the listing and the parts themselves, so it says what readers will read;
a source found in two parts is a :class:`SinkError` (it never is: parts are exactly once).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson

from rayorch.runtime.id_spill import IdSpill
from rayorch.runtime.sink_layout import read_parts, sink_parts
from rayorch.storage import Storage, StorageError
from rayorch.store.records.sink import SinkError

INDEX_NAME = "_index.parquet"
BATCH = 65536
"""Index rows per Parquet row group written."""


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([("id", pa.int64()), ("source", pa.string()), ("outcome", pa.string()),
                      ("shard", pa.string()), ("row", pa.int64())])


def write_index(storage: Storage) -> int:
    """Write ``_index.parquet`` beside the sink's parts (one replacing write); its rows.

    The parts are read ahead on threads, each record's place goes to a local spill
    (:class:`~rayorch.runtime.id_spill.IdSpill`) and comes back in id order, a row group at
    a time: a sink of a million sources is indexed in a few tens of MB.
    """
    import pyarrow.parquet as pq

    storage, _, names = sink_parts(storage)
    schema = _schema()
    with IdSpill() as spill:
        for name, records in read_parts(storage, names):
            for position, (rec, _) in enumerate(records):
                source = None
                if rec.value_json is not None:
                    value = orjson.loads(rec.value_json)
                    if isinstance(value, dict) and isinstance(value.get("source"), str):
                        source = value["source"]
                if not spill.add(rec.index, orjson.dumps([source, rec.outcome, name,
                                                          position])):
                    first = orjson.loads(spill.get(rec.index) or b"[null,null,null]")[2]
                    raise SinkError(f"source {rec.index} is in two parts of {storage.url} "
                                    f"({first}, {name})")
        with tempfile.TemporaryDirectory(prefix="rayorch-index-") as tmp:
            path = Path(tmp) / INDEX_NAME
            with pq.ParquetWriter(path, schema) as writer:
                batch: list[list[Any]] = []
                for index, body in spill.items():
                    batch.append([index, *orjson.loads(body)])
                    if len(batch) >= BATCH:
                        writer.write_table(_table(batch, schema))
                        batch = []
                if batch or not len(spill):
                    writer.write_table(_table(batch, schema))
            try:
                storage.put_file(INDEX_NAME, path)
            except StorageError as exc:
                raise SinkError(f"cannot write {storage.url}/{INDEX_NAME}: {exc}") from None
        return len(spill)


def _table(rows: list[list[Any]], schema: Any) -> Any:
    import pyarrow as pa

    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.Table.from_arrays([pa.array(c, f.type) for c, f in zip(columns, schema,
                                                                     strict=True)],
                                schema=schema)


__all__ = ["INDEX_NAME", "write_index"]
