"""A job's input is a spec read as a stream: a listed directory, or an ``--input-list``
manifest (JSONL, CSV, Parquet; plain, .gz, .zst).

Each run is a real ``rayorch run pdf --ocr text`` subprocess (its own private Ray) on real
PDFs. They protect: ids are listing positions whatever order the sources are dispatched in;
a key added after a run sorting after every delivered one is run by ``--resume`` under the
next id, one sorting before is refused naming the id it would move (docs: "Inputs");
a manifest's other columns reach ``documents.jsonl`` under ``metadata``; a row naming a
missing file, or no file at all, fails that source alone with its cause.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rayorch.testing_cli import run_rayorch as rayorch
from rayorch.testing_inputs import pdf_archives, write_input_list

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"
SMALL = ["phonrule-doc.pdf", "poemscol-cheatsheet.pdf", "qtree-qarrows.pdf", "parallel.pdf"]


def rows_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]


def job(*argv: str) -> tuple[int, dict[str, Any], str]:
    done = rayorch("run", "pdf", "--ocr", "text", "--no-progress", "--json", *argv)
    summary = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    return done.returncode, summary, done.stderr


def test_ids_are_listing_positions_and_resume_takes_keys_added_after_the_last(
    tmp_path: Path,
) -> None:
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    for name in SMALL[:3]:  # b-, c-, d-: sizes unlike their key order (largest goes first)
        shutil.copyfile(EXAMPLES / name, inputs / f"{'bcd'[SMALL.index(name)]}-{name}")
    code, summary, err = job("--input", str(inputs), "--output", str(out))
    assert code == 0, err[-2000:]
    listed = sorted(str(p) for p in inputs.iterdir())
    assert [(r["id"], r["source"]) for r in rows_of(out)] == list(enumerate(listed))

    shutil.copyfile(EXAMPLES / SMALL[3], inputs / f"e-{SMALL[3]}")  # after every key
    code, summary, err = job("--input", str(inputs), "--output", str(out), "--resume")
    assert code == 0, err[-2000:]
    assert (summary["documents"], summary["kept"], summary["succeeded"]) == (4, 3, 4)
    assert [r["source"] for r in rows_of(out)] == [*listed, str(inputs / f"e-{SMALL[3]}")]

    shutil.copyfile(EXAMPLES / SMALL[3], inputs / f"a-{SMALL[3]}")  # before id 0
    code, summary, err = job("--input", str(inputs), "--output", str(out), "--resume")
    assert code == 2, err[-2000:]
    assert "the input changed: id 0 was" in err and "a-parallel.pdf" in err
    assert len(rows_of(out)) == 4  # what was delivered stays


@pytest.mark.parametrize("name", ["list.jsonl.gz", "list.csv.zst", "list.parquet"])
def test_an_input_list_carries_its_columns_and_a_missing_row_fails_alone(
    tmp_path: Path, name: str,
) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("zstandard")
    rows = [{"url": str(EXAMPLES / SMALL[0]), "license": "cc-by", "crawl": "2024-01"},
            {"url": str(tmp_path / "gone.pdf"), "license": "cc0", "crawl": "2024-02"},
            {"url": str(EXAMPLES / SMALL[1]), "license": "mit", "crawl": "2024-03"}]
    manifest = write_input_list(tmp_path / name, rows)
    out = tmp_path / "out"
    code, summary, err = job("--input-list", str(manifest), "--output", str(out))
    assert code == 1, err[-2000:]  # one source failed
    assert (summary["documents"], summary["succeeded"], summary["failed"]) == (3, 2, 1)
    got = rows_of(out)
    assert [r["source"] for r in got] == [r["url"] for r in rows]
    assert [r["status"] for r in got] == ["ok", "failed", "ok"]
    assert "failed: missing: " in got[1]["cause"] and "gone.pdf" in got[1]["cause"]
    assert [r.get("metadata") for r in got] == [{k: v for k, v in r.items() if k != "url"}
                                                for r in rows]  # the failed one's too


def test_a_list_row_without_a_file_fails_alone_and_a_bad_list_is_a_usage_error(
    tmp_path: Path,
) -> None:
    manifest = tmp_path / "list.jsonl"
    manifest.write_text(json.dumps({"path": str(EXAMPLES / SMALL[0]), "n": 1}) + "\n"
                        + json.dumps({"name": "no url here"}) + "\n" + "not json\n")
    out = tmp_path / "out"
    code, _, err = job("--input-list", str(manifest), "--output", str(out),
                       "--allow-failures")
    assert code == 0, err[-2000:]
    got = rows_of(out)
    assert [r["status"] for r in got] == ["ok", "failed", "failed"]
    assert got[0]["metadata"] == {"n": 1}
    assert "no 'url' or 'path' column" in got[1]["cause"]
    assert "line 3 is not JSON" in got[2]["cause"]

    code, _, err = job("--input-list", str(tmp_path / "list.txt"), "--output",
                       str(tmp_path / "o2"))
    assert code == 2 and "name it .jsonl, .csv or .parquet" in err
    code, _, err = job("--input", str(EXAMPLES), "--input-list", str(manifest), "--output",
                       str(tmp_path / "o3"))
    assert code == 2 and "one of them" in err


def test_archive_members_are_sources_and_a_corrupt_member_fails_alone(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    zipped, tarred = pdf_archives(inputs, [EXAMPLES / name for name in SMALL[:3]])
    shutil.copyfile(EXAMPLES / SMALL[3], inputs / f"c-{SMALL[3]}")
    out = tmp_path / "out"
    code, summary, err = job("--input", str(inputs), "--output", str(out))
    assert code == 1, err[-2000:]
    got = rows_of(out)
    assert [(r["source"], r["status"]) for r in got] == [
        (f"{zipped}#{SMALL[0]}", "ok"), (f"{zipped}#{SMALL[1]}", "ok"),
        (f"{zipped}#bad.pdf", "failed"), (f"{tarred}#docs/{SMALL[2]}", "ok"),
        (str(inputs / f"c-{SMALL[3]}"), "ok")]
    assert "failed: damaged: " in got[2]["cause"] and "CRC" in got[2]["cause"]
    assert summary["pages"] == sum(r["pages"] for r in got)
    assert sorted(p.name for p in inputs.iterdir()) == ["a.zip", "b.tar.gz", f"c-{SMALL[3]}"]
