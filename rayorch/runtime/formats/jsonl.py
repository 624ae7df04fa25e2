"""JSON lines parts: ``jsonl`` (the sink's record lines) and ``jsonl.zst`` (zstandard).

``jsonl`` holds each record's canonical line, byte for byte. ``jsonl.zst`` holds, with a
schema, one row per line (the schema's columns, then ``outcome`` and ``output``; bytes as
``{"$bytes": base64}``), else the record lines; one zstandard frame per part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from rayorch.runtime.formats import RowSchema
from rayorch.runtime.formats.rows import record_of_row, rows_of
from rayorch.store.records.sink import SinkError, SinkRecord, record_of_line


@dataclass(frozen=True)
class JsonLines:
    name: str = "jsonl"
    suffix: str = "jsonl"
    needs: str | None = None

    def encode(self, records: Sequence[SinkRecord], schema: RowSchema | None) -> bytes:
        return b"".join(r.line + b"\n" for r in records)

    def decode(self, data: bytes, where: str) -> list[SinkRecord]:
        return [record_of_line(line, where) for line in data.splitlines() if line]


@dataclass(frozen=True)
class ZstdJsonLines:
    name: str = "jsonl.zst"
    suffix: str = "jsonl.zst"
    needs: str | None = "shards"
    level: int = 6

    def encode(self, records: Sequence[SinkRecord], schema: RowSchema | None) -> bytes:
        import zstandard

        if schema is None:
            text = JSONL.encode(records, None)
        else:
            text = b"".join(orjson.dumps(row) + b"\n"
                            for row in rows_of(records, schema, binary=False))
        return zstandard.ZstdCompressor(level=self.level).compress(text)

    def decode(self, data: bytes, where: str) -> list[SinkRecord]:
        import zstandard

        try:
            text = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        except zstandard.ZstdError as exc:
            raise SinkError(f"{where} is not a zstandard file ({exc})") from None
        out = []
        for line in text.splitlines():
            if not line:
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise SinkError(f"{where}: a line is not JSON ({exc})") from None
            if isinstance(obj, dict) and "index" in obj:
                out.append(record_of_line(line, where))
            elif isinstance(obj, dict):
                out.append(record_of_row(obj, where))
            else:
                raise SinkError(f"{where}: a line is not a rayorch row")
        return out


JSONL = JsonLines()
JSONL_ZST = ZstdJsonLines()

__all__ = ["JSONL", "JSONL_ZST"]
