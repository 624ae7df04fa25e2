"""Input manifests as tests and benches write them (``--input-list``): ``rows`` in the
format the file's name says (:mod:`rayorch.pipelines.input_lists` reads them back)."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any


def input_list_bytes(name: str, rows: list[dict[str, Any]]) -> bytes:
    """``rows`` as the manifest named ``name`` holds them: ``.jsonl``/``.csv`` (plain,
    ``.gz`` or ``.zst``) or ``.parquet``."""
    if ".parquet" in name:
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), sink)
        return sink.getvalue()
    if ".csv" in name:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        data = text.getvalue().encode()
    else:
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    if name.endswith(".gz"):
        return gzip.compress(data)
    if name.endswith(".zst"):
        import zstandard

        return bytes(zstandard.ZstdCompressor().compress(data))
    return data


def write_input_list(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` written to the manifest ``path`` (:func:`input_list_bytes`); ``path``."""
    path.write_bytes(input_list_bytes(path.name, rows))
    return path





def pdf_archives(folder: Path, pdfs: list[Path]) -> tuple[Path, Path]:
    """``folder/a.zip`` (``pdfs[0]``, ``pdfs[1]`` and ``bad.pdf``, whose stored bytes no
    longer match its CRC) and ``folder/b.tar.gz`` (``pdfs[2]`` under ``docs/``)."""
    import tarfile
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    zipped = folder / "a.zip"
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(pdfs[0].name, pdfs[0].read_bytes())
        archive.writestr(pdfs[1].name, pdfs[1].read_bytes())
        archive.writestr("bad.pdf", b"%PDF-1.4\n% corrupt-me " + b"x" * 64)
    zipped.write_bytes(zipped.read_bytes().replace(b"corrupt-me", b"corrupt-it"))
    tarred = folder / "b.tar.gz"
    with tarfile.open(tarred, "w:gz") as archive:
        archive.add(pdfs[2], arcname=f"docs/{pdfs[2].name}")
    return zipped, tarred
__all__ = ["input_list_bytes", "pdf_archives", "write_input_list"]
