"""The storage layer from the outside: what URL a user may pass, what is refused and how,
local paths and ``file://`` unchanged, claim markers settling adopt-or-discard, secrets
never printed. (The same sink on a real S3 server: tests/storage.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rayorch.core.errors import MissingExtraError
from rayorch.runtime.sink_audit import check_delivery
from rayorch.runtime.sinks import (
    CLAIM_PREFIX,
    DISCARD,
    SINK_MANIFEST,
    FileSink,
    read_outputs,
)
from rayorch.storage import StorageError, open_storage, parse_location

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("url", "words"), [
    ("foo://bucket/x", "no storage serves the scheme 'foo'"),
    ("hdfs://nn/x", "no storage serves the scheme 'hdfs'"),
    ("s3:/corpus/in", "names no bucket"),  # once silently a local folder named "s3:"
    ("s3://key:secret@bucket/x", "credentials do not belong in the URL"),
    ("s3://bucket/x?region=eu", "takes no query"),
    ("s3://bucket/../x", "not a relative storage key"),
    ("file://host/x", "not a host"),
])
def test_a_url_nothing_serves_is_refused_never_taken_as_a_path(url: str, words: str) -> None:
    with pytest.raises(StorageError, match=words) as err:
        open_storage(url)
    assert "secret" not in str(err.value)


def test_the_pdf_job_refuses_an_unknown_scheme_with_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input",
                           "foo://corpus/in", "--output", "out"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "no storage serves the scheme 'foo'" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing made locally, no folder "foo:"


def test_plain_paths_and_file_urls_are_the_same_sink(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert parse_location(f"file://{out}").root == str(out)
    facts = FileSink(f"file://{out}", run_id="r").write_part(0, [(0, "a"), (1, "b")])
    assert {p.name for p in out.iterdir()} == {SINK_MANIFEST, facts[0].sink.partition(":")[2]}
    assert list(read_outputs(out)) == list(read_outputs(f"file://{out}"))
    assert FileSink(out, run_id="r").url == str(out.resolve())
    assert check_delivery(f"file://{out}", facts, complete=True) == []


def test_a_discard_claim_whose_writer_died_hides_the_part_and_the_next_holder_removes_it(
        tmp_path: Path) -> None:
    sink = FileSink(tmp_path, run_id="r")
    kept = sink.write_part(0, [(0, "a")])
    dead = sink.write_part(0, [(1, "b")])
    name = dead[0].sink.partition(":")[2]
    (tmp_path / f"{CLAIM_PREFIX}{name}").write_bytes(DISCARD)  # died before deleting it
    assert [r["index"] for r in read_outputs(tmp_path)] == [0]
    heir = FileSink(tmp_path, run_id="r")
    assert heir.adopt(0, [1]) == []  # a part claimed for discarding is never adopted
    assert heir.parts_by_index(0) == {0: {kept[0].sink.partition(":")[2]}}
    assert not (tmp_path / name).exists() and not (tmp_path / f"{CLAIM_PREFIX}{name}").exists()
    assert check_delivery(tmp_path, kept, complete=True) == []


def test_adopting_first_wins_over_a_later_discard_and_the_facts_name_the_part_itself(
        tmp_path: Path) -> None:
    writer = FileSink(tmp_path, run_id="r")
    written = writer.write_part(3, [(5, "x"), (6, "y")])
    heir = FileSink(tmp_path, run_id="r")
    adopted = heir.adopt(3, [5, 6])
    writer.discard(written)  # the deposed writer's refused append: the claim stands
    assert [(f.index, f.sink, f.digest) for f in adopted] == \
        [(f.index, f.sink, f.digest) for f in written]
    assert sorted(r["index"] for r in read_outputs(tmp_path)) == [5, 6]
    # a second (deposed) adopter's claim: the next holder republishes, the old part goes
    third = FileSink(tmp_path, run_id="r")
    again = third.adopt(3, [5, 6])
    assert {f.digest for f in again} == {f.digest for f in written}
    assert {f.sink for f in again} != {f.sink for f in written}
    assert sorted(r["index"] for r in read_outputs(tmp_path)) == [5, 6]


def test_an_object_url_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    import rayorch.storage as storage
    import rayorch.storage.objects as objects

    monkeypatch.setattr(objects, "_obstore", lambda: None)
    monkeypatch.setattr(storage, "_stores", {})
    with pytest.raises(MissingExtraError, match=r"pip install 'rayorch\[gcs\]'"):
        open_storage("gs://bucket/prefix")
    with pytest.raises(MissingExtraError, match=r"pip install 'rayorch\[azure\]'"):
        open_storage("az://account/container/prefix")


def test_a_storage_option_secret_is_never_printed(tmp_path: Path) -> None:
    pytest.importorskip("obstore")
    secret = "SUPERSECRET-7f3a"
    proc = subprocess.run(
        [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", "s3://nobucket/in",
         "--output", str(tmp_path / "out"), "--storage-option", "endpoint=http://127.0.0.1:9",
         "--storage-option", f"aws_secret_access_key={secret}",
         "--storage-option", "aws_access_key_id=AKIAEXAMPLE"],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path),
             "RAYORCH_STORAGE_PATIENCE_S": "0"})
    assert proc.returncode == 2, proc.stderr
    assert "cannot list the input s3://nobucket/in" in proc.stderr
    assert secret not in proc.stderr + proc.stdout
