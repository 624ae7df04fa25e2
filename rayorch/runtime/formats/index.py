"""``_index.parquet``: where each source of a sink is, part by part.

One row per record: ``id`` (the source index), ``source`` (its row's ``source`` when the
value has one), ``outcome``, ``shard`` (the part's name) and ``row`` (its position in the
part). Built from the listing and the parts themselves, so it says what readers will read;
a source found in two parts is a :class:`SinkError` (it never is: parts are exactly once).
"""

from __future__ import annotations

import io
from pathlib import Path

import orjson

from rayorch.runtime.sink_layout import read_part, sink_parts
from rayorch.storage import Storage, StorageError
from rayorch.store.records.sink import SinkError

INDEX_NAME = "_index.parquet"


def index_table(out_dir: str | Path | Storage) -> object:
    """The index of the sink at ``out_dir`` as a pyarrow table (sorted by id)."""
    import pyarrow as pa

    storage, _, names = sink_parts(out_dir)
    rows: dict[int, tuple[str | None, str, str, int]] = {}
    for name in names:
        for position, (rec, _) in enumerate(read_part(storage, name)):
            if rec.index in rows:
                raise SinkError(f"source {rec.index} is in two parts of {storage.url} "
                                f"({rows[rec.index][2]}, {name})")
            source = None
            if rec.value_json is not None:
                value = orjson.loads(rec.value_json)
                if isinstance(value, dict) and isinstance(value.get("source"), str):
                    source = value["source"]
            rows[rec.index] = (source, rec.outcome, name, position)
    ids = sorted(rows)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "source": pa.array([rows[i][0] for i in ids], pa.string()),
        "outcome": pa.array([rows[i][1] for i in ids], pa.string()),
        "shard": pa.array([rows[i][2] for i in ids], pa.string()),
        "row": pa.array([rows[i][3] for i in ids], pa.int64()),
    })


def write_index(storage: Storage) -> int:
    """Write ``_index.parquet`` beside the sink's parts (one atomic write); its rows."""
    import pyarrow.parquet as pq

    table = index_table(storage)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    try:
        storage.put(INDEX_NAME, buffer.getvalue())
    except StorageError as exc:
        raise SinkError(f"cannot write {storage.url}/{INDEX_NAME}: {exc}") from None
    return int(table.num_rows)  # type: ignore[attr-defined]


__all__ = ["INDEX_NAME", "index_table", "write_index"]
