"""Training-ready outputs: ``rayorch run pdf --format parquet|jsonl.zst|wds --shard-size``.

Each run is a real ``rayorch run pdf`` subprocess (its own private Ray) over real PDFs. The
shards are read back by the readers a training team uses (pyarrow.dataset, DuckDB, Hugging
Face ``datasets``, the ``webdataset`` library): each gives exactly one row per source, with
the same Markdown as the default ``--format files`` writes to ``.md`` files; ``_index.parquet``
says where each source is; no multi-record shard exceeds 1.1x the target.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayorch.pipelines.job.cli import DOCUMENT_NAME, MARKER
from rayorch.runtime.sinks import read_outputs
from rayorch.store.records.sink import PartName
from rayorch.testing_cli import cli_env
from rayorch.testing_cli import run_rayorch as rayorch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"
SMALL = ["phonrule-doc.pdf", "poemscol-cheatsheet.pdf", "qtree-qarrows.pdf", "parallel.pdf"]
TARGET = 24_000  # bytes per shard: several shards of a few documents each
TARGETS = {"files": TARGET, "parquet": TARGET, "jsonl.zst": 4_000, "wds": TARGET}
"""jsonl.zst compresses these documents' text about 8x: a smaller target rolls it too."""


def corpus(root: Path, copies: int = 2) -> Path:
    inputs = root / "in"
    inputs.mkdir(exist_ok=True)
    for copy in range(copies):
        for name in SMALL:
            shutil.copyfile(EXAMPLES / name, inputs / f"{copy}-{name}")
    return inputs


def run_job(inputs: Path, out: Path, *extra: str) -> dict[str, object]:
    done = rayorch("run", "pdf", "--input", str(inputs), "--output", str(out), "--ocr", "text",
                   "--no-progress", "--json", *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, object] = json.loads(done.stdout)
    return summary


def shards(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if PartName.parse(p.name) is not None)


def text(member: str | bytes) -> str:
    """A ``.md`` member as WebDataset readers give it (bytes: its extension is not txt)."""
    return member.decode("utf-8") if isinstance(member, bytes) else member


def parquet_shards(out: Path) -> list[str]:
    return sorted(glob.glob(str(out / "part-*.parquet")))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("formats")
    inputs = corpus(root)
    outs = {}
    for fmt in ("files", "parquet", "jsonl.zst", "wds"):
        out = root / fmt.replace(".", "-")
        run_job(inputs, out, "--format", fmt, "--shard-size", str(TARGETS[fmt]))
        outs[fmt] = out
    yield outs


def markdown_by_source(files_out: Path) -> dict[str, str]:
    """What ``--format files`` wrote: each source's ``.md``."""
    rows = [json.loads(line) for line in (files_out / "documents.jsonl").read_text().splitlines()]
    return {Path(r["source"]).name: (files_out / r["markdown"]).read_text() for r in rows}


def test_parquet_shards_read_by_pyarrow_duckdb_and_datasets(runs: dict[str, Path],
                                                            tmp_path: Path) -> None:
    import duckdb
    import pyarrow.dataset as ds
    from datasets import load_dataset

    expected = markdown_by_source(runs["files"])
    out = runs["parquet"]
    assert not [p for p in out.iterdir() if DOCUMENT_NAME.match(p.name)]  # no file per source
    table = ds.dataset(parquet_shards(out), format="parquet").to_table()
    assert table.num_rows == len(expected)
    rows = table.to_pylist()
    assert {Path(r["source"]).name: r["markdown"] for r in rows} == expected
    assert sorted(r["id"] for r in rows) == list(range(len(expected)))
    first = min(rows, key=lambda r: r["id"])
    assert first["status"] == "ok" and first["metadata"] == "{}" and first["run_id"]
    assert first["pages"][0]["number"] == 1 and first["pages"][0]["engine"] == "text"
    assert sum(p["chars"] or 0 for p in first["pages"]) > 0

    pattern = str(out / "part-*.parquet")
    count, distinct = duckdb.sql(
        f"select count(*), count(distinct id) from read_parquet('{pattern}')").fetchall()[0]
    assert count == distinct == len(expected)
    by_duck = dict(duckdb.sql(f"select source, markdown from read_parquet('{pattern}')")
                   .fetchall())
    assert {Path(s).name: m for s, m in by_duck.items()} == expected

    hf = load_dataset("parquet", data_files=pattern, split="train",
                      cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == len(expected)
    assert {Path(r["source"]).name: r["markdown"] for r in hf} == expected

    index = ds.dataset(out / "_index.parquet").to_table().to_pylist()
    assert [r["id"] for r in index] == list(range(len(expected)))
    for entry in index:  # (shard, row) is where the source is
        row = ds.dataset(out / entry["shard"]).to_table().slice(entry["row"], 1).to_pylist()[0]
        assert row["id"] == entry["id"] and row["source"] == entry["source"]


def test_shards_roll_by_size_and_every_source_is_in_one(runs: dict[str, Path]) -> None:
    for fmt in ("parquet", "jsonl.zst", "wds"):
        parts = shards(runs[fmt])
        assert len(parts) > 1, fmt
        for part in parts:
            name = PartName.parse(part.name)
            assert name is not None
            if name.count > 1:  # one record larger than the target is a shard of its own
                assert part.stat().st_size <= 1.1 * TARGETS[fmt], (fmt, part.name)
        records = list(read_outputs(runs[fmt]))  # a source in two parts raises
        assert sorted(r["index"] for r in records) == list(range(2 * len(SMALL)))
        assert json.loads((runs[fmt] / MARKER).read_text())["status"] == "complete"


def test_webdataset_tars_read_by_webdataset_and_datasets(runs: dict[str, Path],
                                                         tmp_path: Path) -> None:
    import webdataset as wds
    from datasets import load_dataset

    expected = markdown_by_source(runs["files"])
    tars = sorted(glob.glob(str(runs["wds"] / "part-*.tar")))
    samples = list(wds.WebDataset(tars, shardshuffle=False).decode())
    assert len(samples) == len(expected)
    got = {Path(s["json"]["source"]).name: text(s["md"]) for s in samples}
    assert got == expected

    hf = load_dataset("webdataset", data_files=tars, split="train",
                      cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == len(expected)
    assert {Path(r["json"]["source"]).name: text(r["md"]) for r in hf} == expected


@pytest.mark.parametrize("fmt", ["parquet", "jsonl.zst", "wds"])
def test_the_output_folder_loads_with_its_declared_types(runs: dict[str, Path], fmt: str,
                                                         tmp_path: Path) -> None:
    """The dataset card (``README.md``) names the shards and their types: ``load_dataset``
    on the folder reads every format, one row per source, _index.parquet left out."""
    from datasets import load_dataset

    expected = markdown_by_source(runs["files"])
    hf = load_dataset(str(runs[fmt]), split="train", cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == len(expected)
    if fmt == "wds":
        got = {Path(r["json"]["source"]).name: text(r["md"]) for r in hf}
    else:
        got = {Path(r["source"]).name: r["markdown"] for r in hf}
    assert got == expected


def test_jsonl_zst_lines_read_by_zstandard_and_datasets(runs: dict[str, Path],
                                                        tmp_path: Path) -> None:
    import zstandard
    from datasets import load_dataset

    expected = markdown_by_source(runs["files"])
    files = sorted(glob.glob(str(runs["jsonl.zst"] / "part-*.jsonl.zst")))
    lines = [json.loads(line) for f in files for line in zstandard.ZstdDecompressor()
             .decompressobj().decompress(Path(f).read_bytes()).splitlines()]
    assert {Path(r["source"]).name: r["markdown"] for r in lines} == expected
    hf = load_dataset("json", data_files=files, split="train", cache_dir=str(tmp_path / "hf"))
    assert {Path(r["source"]).name: r["markdown"] for r in hf} == expected


@pytest.mark.long
def test_three_kills_and_a_resume_leave_every_source_once_and_audited(
    redis_url: str, tmp_path: Path,
) -> None:
    import pyarrow.dataset as ds

    inputs = corpus(tmp_path, copies=8)
    total = len(list(inputs.iterdir()))
    out = tmp_path / "out"
    argv = ["run", "pdf", "--input", str(inputs), "--output", str(out), "--store", redis_url,
            "--ocr", "text", "--render-replicas", "1", "--no-progress", "--format", "parquet",
            "--shard-size", str(TARGET)]
    for kill in range(3):
        seen = len(shards(out)) if out.exists() else 0
        job = subprocess.Popen([sys.executable, "-m", "rayorch.cli", *argv,
                                *(["--resume"] if kill else [])], env=cli_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
        try:
            while job.poll() is None and len(shards(out) if out.exists() else []) <= seen:
                time.sleep(0.02)  # a shard appears while the run goes on: then kill it
            assert job.poll() is None, f"run {kill + 1} ended before a shard was published"
            os.killpg(job.pid, signal.SIGKILL)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
            job.wait(60)
        assert json.loads((out / MARKER).read_text())["status"] == "running"
        # the shard a killed writer was filling is not visible: what is there reads whole
        assert ds.dataset(parquet_shards(out), format="parquet").to_table().num_rows == len(
            {r["index"] for r in read_outputs(out)})

    again = subprocess.run([sys.executable, "-m", "rayorch.cli", *argv, "--resume", "--json"],
                           env=cli_env(), capture_output=True, text=True, timeout=600,
                           check=False)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout)
    assert (summary["documents"], summary["failed"]) == (total, 0)
    ids = ds.dataset(parquet_shards(out), format="parquet").to_table(
        columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(total))  # 0 duplicates, 0 missing
    index = ds.dataset(out / "_index.parquet").to_table().column("id").to_pylist()
    assert index == list(range(total))
    # the resume's run, or the last killed one when it had delivered everything already (on
    # a loaded machine the third kill may land after its run's last delivery)
    run_id = summary["run_id"] or json.loads((out / MARKER).read_text())["runs"][-1]
    audit = rayorch("audit", str(run_id), "--store", redis_url)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert f"run {run_id}: OK" in audit.stdout
