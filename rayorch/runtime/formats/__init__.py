"""Part formats: how a file sink turns records into one part file's bytes and back.

A format is a small object (:class:`PartFormat`): its ``name`` (what ``--format`` says),
the ``suffix`` of its part files, and ``encode``/``decode``. ``encode`` takes the records
of one part and a :class:`RowSchema` (the declared, versioned columns of a job's rows; None:
the generic record layout of any ``Pipeline`` output); ``decode`` gives the records back,
each with the same canonical bytes, so a record's digest (what ``OutputEmitted`` holds and
``rayorch audit`` checks) is the same whichever format stored it.

Formats are registered by name as store backends are (:mod:`rayorch.store.registry`): one
line naming ``module:attribute``, imported on first use, so adding Lance or Iceberg is one
module and one :func:`register_format` call::

    register_format("lance", "mypkg.lance_part:LANCE", suffix="lance")
    fmt = part_format("lance")
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from rayorch.store.records.sink import SinkError, SinkRecord

if TYPE_CHECKING:
    import pyarrow as pa


class PartFormat(Protocol):
    """One way to store a part's records (see the module doc)."""

    name: str
    suffix: str
    needs: str | None
    """The extra that installs its libraries (``rayorch[parquet]``), for the error."""

    def encode(self, records: Sequence[SinkRecord], schema: RowSchema | None) -> bytes:
        """One part file's bytes holding ``records`` (in this order)."""
        ...

    def decode(self, data: bytes, where: str) -> list[SinkRecord]:
        """The records of one part file's bytes; :class:`SinkError` naming ``where``."""
        ...


RECORD_COLUMNS = ("outcome", "output")
"""The columns a row carries besides its schema's: whether it is present, else the name
of the output that is not (its ``cause`` is the schema's own ``cause`` column)."""


@dataclass(frozen=True)
class RowSchema:
    """The declared columns of one job's rows (``id`` first, then the value's fields).

    ``fields`` are pyarrow fields; ``text`` names a string column a WebDataset sample holds
    as its own member (``<key>.md``), ``binary`` a list-of-struct column whose ``data``
    bytes become members (``<key>.<i>.<ext>``).
    """

    name: str
    version: int
    fields: tuple[Any, ...]
    text: str | None = None
    binary: tuple[str, str] | None = None  # (column, extension) e.g. ("figures", "png")
    explode: str | None = None
    """The binary column whose entries are one WebDataset sample each (a video's clips)."""
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def arrow(self) -> pa.Schema:
        import pyarrow as pa

        extra = [pa.field("outcome", pa.string()), pa.field("output", pa.string())]
        return pa.schema([*self.fields, *extra],
                         metadata={"rayorch_schema": f"{self.name}/{self.version}"})

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def normalize(self, value: dict[str, Any]) -> dict[str, Any]:
        """``value`` as its decoded form holds it: the schema's fields in order, each of the
        column's type (ints in a float column become floats), unknown keys dropped;
        :class:`SinkError` when a field cannot be that type."""
        import pyarrow as pa

        row = {name: value.get(name) for name in self.columns}
        try:
            table = pa.Table.from_pylist([row], schema=pa.schema(list(self.fields)))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise SinkError(f"a {self.name} row does not fit its schema: {exc}") from None
        normalized: dict[str, Any] = table.to_pylist()[0]
        return normalized

    def describe(self) -> dict[str, Any]:
        """The schema as the sink manifest records it."""
        return {"name": self.name, "version": self.version,
                "columns": {f.name: str(f.type) for f in self.fields}}


@dataclass(frozen=True)
class Registered:
    name: str
    opener: str
    suffix: str


FORMATS: dict[str, Registered] = {}
_LOADED: dict[str, PartFormat] = {}


def register_format(name: str, opener: str, *, suffix: str) -> None:
    """Register format ``name`` (``opener``: ``"module:attribute"`` of a :class:`PartFormat`)
    whose part files end in ``.suffix``."""
    FORMATS[name] = Registered(name, opener, suffix)


def part_format(name: str) -> PartFormat:
    """The format registered as ``name``; :class:`SinkError` listing them otherwise."""
    fmt = _LOADED.get(name)
    if fmt is not None:
        return fmt
    entry = FORMATS.get(name)
    if entry is None:
        raise SinkError(f"unknown output format {name!r}: use one of {', '.join(FORMATS)}")
    module, _, attribute = entry.opener.partition(":")
    loaded: PartFormat = getattr(importlib.import_module(module), attribute)
    _LOADED[name] = loaded
    return loaded


def format_of_suffix(suffix: str) -> str | None:
    """The name of the format whose parts end in ``.suffix`` (None: none)."""
    return next((e.name for e in FORMATS.values() if e.suffix == suffix), None)


def format_names() -> tuple[str, ...]:
    return tuple(FORMATS)


register_format("jsonl", "rayorch.runtime.formats.jsonl:JSONL", suffix="jsonl")
register_format("parquet", "rayorch.runtime.formats.parquet:PARQUET", suffix="parquet")
register_format("jsonl.zst", "rayorch.runtime.formats.jsonl:JSONL_ZST", suffix="jsonl.zst")
register_format("wds", "rayorch.runtime.formats.wds:WDS", suffix="tar")

__all__ = ["FORMATS", "RECORD_COLUMNS", "PartFormat", "RowSchema", "format_names",
           "format_of_suffix", "part_format", "register_format"]
