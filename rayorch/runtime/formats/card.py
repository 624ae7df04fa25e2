"""A dataset card beside a job's shards: ``README.md`` whose front matter declares them.

Hugging Face's ``datasets`` reads a folder's (or a Hub repo's) ``README.md`` front matter:
``configs`` names the data files, ``dataset_info.features`` their types. Without it,
``load_dataset`` guesses the types from the first rows and fails on the first later row
that differs (a ``cause`` that was null in the first five rows, a document with figures
after five without). With it, ``datasets.load_dataset(OUTPUT)`` reads every shard format
with the declared types (docs/output-formats.md). The card is written when the run ends,
with ``_index.parquet``.
"""

from __future__ import annotations

import json
from typing import Any

from rayorch.runtime.formats import FORMATS, RowSchema
from rayorch.storage import Storage, StorageError
from rayorch.store.records.sink import SinkError

CARD_NAME = "README.md"

_SCALARS = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
            "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
            "float": "float32", "double": "float64", "halffloat": "float16",
            "string": "string", "large_string": "large_string", "bool": "bool",
            "binary": "binary", "large_binary": "large_binary"}


def _spec(pa_type: Any, binary_as: str | None) -> Any:
    """One type as the card's YAML holds it: a dtype string, ``{"list": ...}`` or a list of
    named fields (a struct). ``binary_as``: what a binary value is in this format's file
    (``string`` for a marker, ``bytes`` for ``{"$bytes": base64}``), None: binary."""
    import pyarrow as pa

    if pa.types.is_list(pa_type) or pa.types.is_large_list(pa_type):
        return {"list": _spec(pa_type.value_type, binary_as)}
    if pa.types.is_struct(pa_type):
        return [_named(pa_type.field(i).name, pa_type.field(i).type, binary_as)
                for i in range(pa_type.num_fields)]
    name = str(pa_type)
    if name in ("binary", "large_binary") and binary_as == "string":
        return "string"
    if name in ("binary", "large_binary") and binary_as == "bytes":
        return [{"name": "$bytes", "dtype": "string"}]
    if name not in _SCALARS:
        raise SinkError(f"a dataset card cannot declare a column of type {name}")
    return _SCALARS[name]


def _named(name: str, pa_type: Any, binary_as: str | None) -> dict[str, Any]:
    spec = _spec(pa_type, binary_as)
    if isinstance(spec, str):
        return {"name": name, "dtype": spec}
    if isinstance(spec, list):
        return {"name": name, "struct": spec}
    return {"name": name, **spec}


def card_features(schema: RowSchema, fmt: str) -> list[dict[str, Any]]:
    """The features of ``schema``'s rows as format ``fmt`` stores them."""
    import pyarrow as pa

    fields = list(schema.arrow)
    if fmt == "parquet":
        return [_named(f.name, f.type, None) for f in fields]
    if fmt == "jsonl.zst":
        return [_named(f.name, f.type, "bytes") for f in fields]
    if fmt != "wds":
        raise SinkError(f"no dataset card for format {fmt!r}")
    row = [_named(f.name, f.type, "string") for f in fields]
    if schema.explode is not None:
        row.append(_named("$entry", pa.struct([("column", pa.string()), ("index", pa.int64())]),
                          None))
    members: list[dict[str, Any]] = [{"name": "json", "struct": row}]
    if schema.text is not None:
        members.append({"name": "md", "dtype": "binary"})
    if schema.binary is not None:
        column, ext = schema.binary
        if schema.explode == column:  # a clip in its own container: one of these each
            from rayorch.runtime.formats.wds import CONTAINERS

            members.extend({"name": name, "dtype": "binary"}
                           for name in dict.fromkeys((ext, *CONTAINERS)))
        else:
            members.append({"name": f"{column}.mp", "list": "binary"})
    return [*members, {"name": "__key__", "dtype": "string"},
            {"name": "__url__", "dtype": "string"}]


def _yaml(value: Any, indent: int) -> list[str]:
    """Block YAML of the card's dicts, lists and strings (names and dtypes are quoted as JSON
    strings, which YAML reads as double-quoted scalars)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
    elif isinstance(value, list):
        for item in value:
            inner = _yaml(item, indent + 2)
            lines.append(f"{pad}- {inner[0].lstrip()}" if inner else f"{pad}- []")
            lines.extend(inner[1:])
    else:
        lines.append(f"{pad}{json.dumps(value)}")
    return lines


def card_text(schema: RowSchema, fmt: str) -> str:
    """The card: front matter (configs, features), then a few lines for people."""
    suffix = FORMATS[fmt].suffix
    front = {"configs": [{"config_name": "default",
                          "data_files": [{"split": "train", "path": f"part-*.{suffix}"}]}],
             "dataset_info": {"features": card_features(schema, fmt)}}
    return "\n".join([
        "---", *_yaml(front, 0), "---", "",
        f"# {schema.name} rows, `{fmt}` shards", "",
        f"Written by rayorch (schema `{schema.name}`, version {schema.version}): one row per "
        "source, in `part-*` files; `_index.parquet` maps each source to its part and row.",
        "Load with `datasets.load_dataset(\"<this folder>\")`.", ""])


def write_card(storage: Storage, schema: RowSchema, fmt: str) -> None:
    """Write ``README.md`` beside the shards (one atomic write)."""
    try:
        storage.put(CARD_NAME, card_text(schema, fmt).encode("utf-8"))
    except StorageError as exc:
        raise SinkError(f"cannot write {storage.url}/{CARD_NAME}: {exc}") from None


__all__ = ["CARD_NAME", "card_features", "card_text", "write_card"]
