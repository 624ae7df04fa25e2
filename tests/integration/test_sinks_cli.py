"""File sinks through the public API and the CLI: resume writes JSONL/Parquet, audit sees loss.

Real Ray (the session's local instance) and a private redis-server per test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from bench.faults import FaultPipeline, make_docs
from rayorch.cli import main as cli_main
from rayorch.core.facts import OutputEmitted
from rayorch.core.reference import evaluate
from rayorch.replicas import create_run, join_run
from rayorch.runtime.sinks import SINK_MANIFEST, FileSink, delivered_count, read_outputs
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration]


def reference_records(docs: list[str]) -> dict[int, tuple[str, Any]]:
    reference = evaluate(FaultPipeline(gpu_ms=0).compile(), [(d,) for d in docs]).outputs
    return {i: (item.outcome.value, item.value if item.present else item.cause)
            for i, (item,) in reference.items()}


def records_of(out: Path) -> dict[int, tuple[str, Any]]:
    """Every record of the sink (``read_outputs`` refuses a source twice)."""
    got: dict[int, tuple[str, Any]] = {}
    for record in read_outputs(out):
        value = record["value"] if record["outcome"] == "present" else record["cause"]
        got[record["index"]] = (record["outcome"], value)
    return got


def audit(run_id: str, url: str, capsys: pytest.CaptureFixture[str], *extra: str
          ) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = cli_main(["audit", run_id, "--store", url, *extra])
    return code, capsys.readouterr().out.splitlines()


def parts(out: Path) -> list[Path]:
    return sorted(out.glob("part-*"))


def fault_run(url: str, tmp_path: Path, n: int, **options: Any) -> tuple[list[str], Path, str]:
    """A run of ``FaultPipeline`` over ``n`` documents (doc7 fails): docs, out dir, run id."""
    docs = make_docs(n)
    run_id = create_run(FaultPipeline, [docs], store=url, kwargs={"gpu_ms": 5}, micro_batch=2,
                        **options)
    return docs, tmp_path / "out", run_id


@pytest.mark.timeout(180)
def test_resume_writes_jsonl_once_per_source_and_audit_sees_lost_or_altered_parts(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs, out, run_id = fault_run(redis_url, tmp_path, 14, shards=2, max_active_sources=4)
    assert cli_main(["resume", run_id, "--store", redis_url, "--lease-ttl", "2", "--quiet",
                     "--out-dir", str(out), "--format", "jsonl"]) == 0
    assert records_of(out) == reference_records(docs)
    assert delivered_count(out) == len(docs) and all(p.suffix == ".jsonl" for p in parts(out))
    code, lines = audit(run_id, redis_url, capsys, "--out-dir", str(out))
    assert code == 0 and lines[0].startswith(f"run {run_id}: OK"), lines
    # The resume recorded where it wrote: the README's audit command checks it as is.
    code, lines = audit(run_id, redis_url, capsys)
    assert code == 0 and lines[0].startswith(f"run {run_id}: OK"), lines
    capsys.readouterr()
    assert cli_main(["resume", run_id, "--store", redis_url, "--quiet", "--out-dir",
                     str(tmp_path / "elsewhere")]) == 2
    assert f"writes its outputs to {out.resolve()} (recorded with the run)" in \
        capsys.readouterr().err

    first, second = parts(out)[:2]
    blob = first.read_bytes()
    first.write_bytes(blob.replace(b'"pages":', b'"pages":1', 1) if b'"pages":' in blob
                      else blob.replace(b'"cause":"', b'"cause":"x', 1))
    gone = {s.fact.index for facts in open_store(redis_url).read_run(run_id).values()
            for s in facts if isinstance(s.fact, OutputEmitted) and second.name in s.fact.sink}
    second.unlink()
    code, lines = audit(run_id, redis_url, capsys, "--out-dir", str(out))
    assert code == 1 and lines[0].startswith(f"run {run_id}: FAILED (2 violations)"), lines
    problems = [line.strip() for line in lines if "VIOLATION" in line]
    assert problems[0].startswith("VIOLATION delivery: source ") and \
        f"its record in part {first.name} was altered" in problems[0], problems
    sources = ", ".join(map(str, sorted(gone)))
    assert problems[1] == (f"VIOLATION delivery: part {second.name} is missing from {out}: "
                           f"sources {sources} were delivered to it"), problems


@pytest.mark.timeout(180)
def test_parquet_sink_chosen_at_creation_reads_with_pandas_and_audits_by_default(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pandas as pd

    docs, out, run_id = fault_run(redis_url, tmp_path, 10, shards=2, out_format="parquet",
                                  out_dir=str(tmp_path / "out"))
    assert (out / SINK_MANIFEST).exists()  # made (and checked) at creation
    capsys.readouterr()
    assert cli_main(["resume", run_id, "--store", redis_url, "--format", "jsonl",
                     "--quiet"]) == 2
    assert "writes parquet outputs (recorded with the run), not jsonl; drop --format" in \
        capsys.readouterr().err
    assert cli_main(["resume", run_id, "--store", redis_url, "--lease-ttl", "2",
                     "--quiet"]) == 0
    assert records_of(out) == reference_records(docs)
    frame = pd.read_parquet(out)  # the manifest's leading "_" keeps it out of the dataset
    assert sorted(frame["index"]) == list(range(len(docs)))
    assert set(frame.columns) == {"index", "outcome", "value_json", "cause", "output"}
    code, lines = audit(run_id, redis_url, capsys)
    assert code == 0, lines
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = parts(out)[0]
    table = pq.read_table(part)
    values = table.column("value_json").to_pylist()
    values[0] = '{"pages":0,"text":"forged"}'
    pq.write_table(table.set_column(2, "value_json", pa.array(values, pa.string())), part)
    code, lines = audit(run_id, redis_url, capsys)
    assert code == 1 and any(f"its record in part {part.name} was altered" in line
                             for line in lines), lines


# -- an output JSON cannot hold ----------------------------------------------------------------
class Halve:
    """Sources 3, 5 and 7 give what the store keeps but JSON cannot: NaN, infinity, a dict
    with int keys."""

    def __call__(self, xs: list[int]) -> list[Any]:
        odd = {3: float("nan"), 5: {"scores": [1.0, float("inf")]}, 7: {1: "one"}}
        return [odd.get(x, x / 2) for x in xs]


class NanPipe(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.halve = ro.RayModule(Halve, num_cpus=0.1, batch_size=4)

    def forward(self, xs: Any) -> Any:
        return self.halve(xs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_outputs_json_cannot_hold_fail_alone_and_the_run_completes(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    fmt: str,
) -> None:
    out = tmp_path / "out"
    run_id = create_run(NanPipe, [list(range(10))], store=redis_url, shards=2, micro_batch=4)
    assert cli_main(["resume", run_id, "--store", redis_url, "--quiet", "--lease-ttl", "2",
                     "--out-dir", str(out), "--format", fmt]) == 0
    records = {r["index"]: r for r in read_outputs(out)}
    assert sorted(records) == list(range(10))
    for x in (0, 1, 2, 4, 6, 8, 9):
        assert records[x] == {"index": x, "outcome": "present", "value": x / 2}
    causes = {x: records[x]["cause"] for x in (3, 5, 7)}
    assert all(records[x]["outcome"] == "failed" for x in causes), records
    assert "(type float) holds NaN or infinity" in causes[3], causes
    assert "(type dict) holds NaN or infinity" in causes[5], causes
    assert "(type dict) cannot be written as JSON" in causes[7] and "str" in causes[7], causes
    code, lines = audit(run_id, redis_url, capsys, "--out-dir", str(out))
    assert code == 0 and lines[0].startswith(f"run {run_id}: OK"), lines


# -- a new holder adopts what a dead one wrote -------------------------------------------------
class DiedAfterWriting(BaseException):
    """The driver process ends between the part's rename and its facts' append."""


@pytest.mark.timeout(180)
def test_a_new_holder_adopts_parts_whose_facts_never_landed(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs, out, run_id = fault_run(redis_url, tmp_path, 12, shards=1, max_active_sources=4,
                                  out_dir=str(tmp_path / "out"))
    write_part = FileSink.write_part
    orphan: list[OutputEmitted] = []

    def write_then_die(sink: FileSink, shard: int, records: Any, **kw: Any
                       ) -> list[OutputEmitted]:
        orphan.extend(write_part(sink, shard, records, **kw))
        raise DiedAfterWriting

    monkeypatch.setattr(FileSink, "write_part", write_then_die)
    with pytest.raises(DiedAfterWriting):
        list(join_run(run_id, store=redis_url, driver_id="a", lease_ttl_s=1.0, quiet=True))
    monkeypatch.undo()
    assert orphan and delivered_count(out) == len(orphan)
    time.sleep(1.2)
    with join_run(run_id, store=redis_url, driver_id="b", lease_ttl_s=1.0, quiet=True) as b:
        b.wait()
    assert records_of(out) == reference_records(docs)  # each source once: none written twice
    assert delivered_count(out) == len(docs)
    facts = [s.fact for facts in open_store(redis_url).read_run(run_id).values()
             for s in facts if isinstance(s.fact, OutputEmitted)]
    assert sorted(f.index for f in facts) == list(range(len(docs)))
    adopted = {f.index: f.digest for f in facts if f.index in {o.index for o in orphan}}
    assert adopted == {f.index: f.digest for f in orphan}
    code, lines = audit(run_id, redis_url, capsys)
    assert code == 0, lines


@pytest.mark.timeout(180)
def test_temp_and_claim_files_a_killed_writer_left_are_removed_when_the_shard_is_taken(
    ray_local: None, redis_url: str, tmp_path: Path
) -> None:
    """A kill during a part's write leaves its hidden temp file; a kill during an adoption
    its claim. The next holder of that shard removes them; another sink's files stay."""
    out = tmp_path / "out"
    docs, out, run_id = fault_run(redis_url, tmp_path, 8, shards=2, out_dir=str(out))
    leftovers = [out / ".rayorch-tmp-part-s00000-000000000000-2-a1b2c3.jsonl-0123abcd",
                 out / ".rayorch-claim-part-s00001-000000000002-2-d4e5f6.jsonl-89abcdef"]
    for path in leftovers:
        path.write_bytes(b'{"index": 0, "outcome": "pres')  # cut short by the kill
    unrelated = out / ".rayorch-notes"
    unrelated.write_text("not a part's")
    assert cli_main(["resume", run_id, "--store", redis_url, "--lease-ttl", "2",
                     "--quiet"]) == 0
    assert records_of(out) == reference_records(docs)
    assert [p for p in leftovers if p.exists()] == []
    assert unrelated.exists()


@pytest.mark.timeout(180)
def test_a_shard_whose_keys_are_gone_fails_the_audit_and_the_resume(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A complete 2-shard run loses every key of shard 1 (LRU eviction, a lost cluster
    master): audit names the shard, resume refuses in one line, runs never says complete."""
    import redis

    _, _, run_id = fault_run(redis_url, tmp_path, 12, shards=2, out_dir=str(tmp_path / "out"))
    assert cli_main(["resume", run_id, "--store", redis_url, "--lease-ttl", "2",
                     "--quiet"]) == 0
    code, lines = audit(run_id, redis_url, capsys)
    assert code == 0, lines
    client = redis.Redis.from_url(redis_url)
    gone = list(client.scan_iter(match=f"ro:{{{run_id}:1}}*"))
    assert gone and client.delete(*gone) == len(gone)
    code, lines = audit(run_id, redis_url, capsys)
    assert code == 1 and lines[0].startswith(f"run {run_id}: FAILED"), lines
    assert any(f"run {run_id} shard 1: its facts are missing: the store holds none for it, "
               "yet it is marked done" in line for line in lines), lines
    capsys.readouterr()
    assert cli_main(["resume", run_id, "--store", redis_url, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shard 1 is marked done but the store holds none of its facts" \
        in err[0] and "cannot be continued" in err[0], err
    assert cli_main(["runs", "--store", redis_url]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if run_id in line]
    assert row and "complete" not in row[0], row
