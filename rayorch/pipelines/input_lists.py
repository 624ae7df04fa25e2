"""``--input-list URL``: a manifest of sources read as a stream.

One row per source: ``url`` (or ``path``) names it; ``size`` (bytes), when given, orders
admission (largest first within a window); ``etag``/``version``, when given, is its
identity; every other column is carried to the job's rows file under ``metadata``. Formats by
name: ``.jsonl``/``.ndjson``/``.json`` (one object a line), ``.csv`` (a header row),
``.parquet``; JSONL and CSV also ``.gz`` or ``.zst``. Local or on an object store: an
object is read in ranged chunks (:class:`RangedFile`), never whole. A row without a usable
``url``/``path`` becomes a source whose name says so, and fails alone (``missing``).
"""

from __future__ import annotations

import gzip
import io
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from rayorch.core.errors import RayorchError
from rayorch.pipelines.sources import PAGE, Listed
from rayorch.storage import Storage, StorageError, open_storage, parse_location

CHUNK = 8 << 20
"""Bytes per ranged read of a manifest (or archive) on an object store."""
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv",
           ".parquet": "parquet"}
COMPRESSIONS = {".gz", ".zst"}
NAME_COLUMNS = ("url", "path")
KNOWN = {"url", "path", "size", "etag", "version"}


class RangedFile(io.RawIOBase):
    """An object on an object store as a seekable read-only file: ranged reads of what is
    asked (Parquet's footer, a zip's central directory), ``CHUNK`` at most each."""

    def __init__(self, storage: Storage, key: str, size: int) -> None:
        self._storage, self._key, self._size, self._at = storage, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), CHUNK, self._size - self._at)
        if want <= 0:
            return 0
        data = self._storage.read_range(self._key, self._at, self._at + want)
        buffer[:len(data)] = data
        self._at += len(data)
        return len(data)


def open_input(url: str, what: str = "--input-list") -> IO[bytes]:
    """``url`` (a local path or an object) opened for reading, buffered and seekable; a
    :class:`RayorchError` in one line (``what`` naming it) when it is missing or unreadable."""
    location = parse_location(url)
    try:
        if location.is_local:
            return open(location.root, "rb")
        storage = open_storage(location.parent())
        info = storage.head(location.name())
    except FileNotFoundError:
        raise RayorchError(f"{what} {url}: no such file") from None
    except (OSError, StorageError) as exc:
        raise RayorchError(f"{what} {url}: cannot read it ({exc})") from None
    if info is None:
        raise RayorchError(f"{what} {url}: no such object")
    return io.BufferedReader(RangedFile(storage, location.name(), info.size), CHUNK)


def list_format(url: str) -> tuple[str, str | None]:
    """``(format, compression)`` of a manifest by its name (a ``RayorchError`` if unknown)."""
    suffixes = [s.lower() for s in Path(parse_location(url).name() or url).suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else None
    kind = FORMATS.get(suffixes[-1]) if suffixes else None
    if kind is None or (kind == "parquet" and compression is not None):
        raise RayorchError(f"--input-list {url}: name it .jsonl, .csv or .parquet (JSONL and "
                           "CSV may be .gz or .zst)")
    return kind, compression


def check_list_url(url: str) -> str:
    """``url`` if its format is known and its extra is installed (a ``RayorchError``)."""
    kind, compression = list_format(url)
    missing = [name for name, needed in (("pyarrow", kind != "jsonl"),
                                         ("zstandard", compression == ".zst")) if needed]
    for name in missing:
        try:
            __import__(name)
        except ImportError:
            raise RayorchError(f"--input-list {url} needs {name}: pip install "
                               "'rayorch[inputs]'") from None
    return url


def _decompressed(raw: IO[bytes], compression: str | None) -> IO[bytes]:
    if compression == ".gz":
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
    if compression == ".zst":
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))
    return raw


def _rows(url: str) -> Iterator[Iterable[Any]]:
    """The manifest's rows, a batch at a time (each row a dict, or anything when damaged)."""
    kind, compression = list_format(url)
    with open_input(url) as raw:
        if kind == "parquet":
            import pyarrow.parquet as pq

            for batch in pq.ParquetFile(raw).iter_batches(batch_size=PAGE):
                yield batch.to_pylist()
            return
        stream = _decompressed(raw, compression)
        if kind == "csv":
            import pyarrow.csv as pcsv

            options = pcsv.ReadOptions(block_size=1 << 20)
            for batch in pcsv.open_csv(stream, read_options=options):
                yield batch.to_pylist()
            return
        rows: list[Any] = []
        for number, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                rows.append(orjson.loads(line))
            except orjson.JSONDecodeError as exc:
                rows.append(f"line {number} is not JSON ({exc.msg})")
            if len(rows) >= PAGE:
                yield rows
                rows = []
        if rows:
            yield rows


def read_input_list(url: str) -> Iterator[list[tuple[Listed, dict[str, Any] | None]]]:
    """The sources of the manifest at ``url`` with their other columns, a page at a time."""
    position = 0
    try:
        for batch in _rows(url):
            page = []
            for row in batch:
                page.append(source_of(row, position, url))
                position += 1
            yield page
    except (OSError, StorageError, ValueError, EOFError) as exc:
        raise RayorchError(f"--input-list {url}: cannot read row {position + 1} on "
                           f"({' '.join(str(exc).split())[:300]})") from None


def source_of(row: Any, position: int, url: str) -> tuple[Listed, dict[str, Any] | None]:
    """One manifest row as a listed source and its other columns (checked: a row without a
    ``url``/``path`` string is a source named after its problem, which fails alone)."""
    if not isinstance(row, dict):
        problem = row if isinstance(row, str) else f"it is a {type(row).__name__}"
        return Listed(f"row {position + 1} of {url}: {problem}", 0, ""), None
    name = next((row[k] for k in NAME_COLUMNS if isinstance(row.get(k), str) and row[k]), None)
    if name is None:
        return (Listed(f"row {position + 1} of {url}: no 'url' or 'path' column", 0, ""),
                None)
    size = row.get("size")
    size = size if type(size) is int and size >= 0 else 0
    identity = str(row.get("etag") or row.get("version") or "")
    metadata = {str(k): plain(v) for k, v in row.items() if k not in KNOWN}
    return Listed(name, size, identity), metadata or None


def plain(value: Any) -> Any:
    """A manifest value as JSON can hold it (dates and the like as text, NaN as None)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


__all__ = ["CHUNK", "RangedFile", "check_list_url", "list_format", "open_input",
           "read_input_list", "source_of"]
