"""The shared job-command rules, without Ray: output directory, summary, exit codes, hook.

An "earlier run" here writes what the driver writes: each result through the run's file
sink (``FileSink.write_part``: the job's files, then the part file with its record).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rayorch as ro
from rayorch.cli import main as cli_main
from rayorch.pipelines.job.cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    VIDEO_JOB,
    JobSummary,
    OutputDir,
    UsageError,
    plural,
)
from rayorch.pipelines.job.pdf_outputs import PDF_WRITER
from rayorch.pipelines.job.summary import MAX_KEPT_FAILURES
from rayorch.pipelines.job.video_outputs import VIDEO_WRITER
from rayorch.progress import RunStats
from rayorch.runtime.sinks import read_outputs

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["a.pdf", "b.pdf", "c.pdf"]


def failed(index: int, cause: str = "broken: not a PDF") -> ro.FailedResult:
    return ro.FailedResult(index, ro.Outcome.FAILED, cause)


def finished_run(out: Path, statuses: list[str]) -> None:
    """An earlier run into ``out``: each document delivered through the run's sink."""
    target = OutputDir.prepare(out, job="pdf", sources=SOURCES, options={"ocr": "auto"})
    sink = target.sink_for("run-1", PDF_WRITER)
    target.note_run("run-1")
    for index, status in enumerate(statuses):
        value: Any = {"path": SOURCES[index], "markdown": f"doc {index}", "pages": 1}
        sink.write_part(0, [(index, value if status == "ok" else failed(index))])
    target.finish(complete=True)


def test_a_new_or_empty_directory_is_taken(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new" / "deeper", tmp_path / "empty"):
        OutputDir.prepare(out, job="pdf", sources=SOURCES, options={}).finish(complete=True)
        assert sorted(p.name for p in out.iterdir()) == [".rayorch-output.json",
                                                         "documents.jsonl"]


def test_an_earlier_run_is_refused_in_one_line(tmp_path: Path) -> None:
    finished_run(tmp_path, ["ok", "failed", "ok"])
    with pytest.raises(UsageError) as info:
        OutputDir.prepare(tmp_path, job="pdf", sources=SOURCES, options={"ocr": "auto"})
    message = str(info.value)
    assert "\n" not in message and "--overwrite" in message and "--resume" in message


def test_a_foreign_directory_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("mine")
    with pytest.raises(UsageError, match="holds no earlier rayorch run"):
        OutputDir.prepare(tmp_path, job="pdf", sources=SOURCES, options={}, overwrite=True)
    assert (tmp_path / "thesis.tex").read_text() == "mine"


def test_overwrite_leaves_no_stale_document(tmp_path: Path) -> None:
    finished_run(tmp_path, ["ok", "ok", "ok"])
    (tmp_path / "notes.txt").write_text("the user's own file")
    out = OutputDir.prepare(tmp_path, job="pdf", sources=SOURCES[:1], options={},
                            overwrite=True)
    out.finish(complete=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".rayorch-output.json", "documents.jsonl", "notes.txt"]
    assert (tmp_path / "documents.jsonl").read_text() == ""


def test_resume_keeps_finished_documents_and_redoes_the_rest(tmp_path: Path) -> None:
    finished_run(tmp_path, ["ok", "failed", "ok"])
    (tmp_path / "00002-c.md").unlink()  # lost since: must run again
    (tmp_path / "00001-b.md").write_text("written before a crash, never recorded")
    out = OutputDir.prepare(tmp_path, job="pdf", sources=SOURCES, options={"ocr": "auto"},
                            resume=True)
    assert sorted(out.kept) == [0]  # 1 and 2 run again
    assert sorted(p.name for p in tmp_path.glob("*.md")) == ["00000-a.md"]
    assert [r["index"] for r in read_outputs(tmp_path)] == [0]  # the part files keep 0 only
    sink = out.sink_for("run-2", PDF_WRITER)
    out.note_run("run-2")
    sink.write_part(0, [(2, {"path": "c.pdf", "markdown": "doc 2 again", "pages": 1}),
                        (1, failed(1))])
    out.finish(complete=True)
    rows = [json.loads(line) for line in (tmp_path / "documents.jsonl").read_text().splitlines()]
    assert [(r["id"], r["status"]) for r in rows] == [(0, "ok"), (1, "failed"), (2, "ok")]
    assert (tmp_path / "00002-c.md").read_text() == "doc 2 again"
    assert sorted(r["index"] for r in read_outputs(tmp_path)) == [0, 1, 2]
    manifest = json.loads((tmp_path / "_rayorch_sink.json").read_text())
    assert (manifest["run"], manifest["earlier"]) == ("run-2", ["run-1"])
    assert len(manifest["kept"]) == 1  # the part of document 0, delivered by run-1


def test_resume_refuses_other_inputs_or_options(tmp_path: Path) -> None:
    finished_run(tmp_path, ["ok", "ok", "ok"])
    with pytest.raises(UsageError, match="the --input changed"):
        OutputDir.prepare(tmp_path, job="pdf", sources=SOURCES[:2], options={"ocr": "auto"},
                          resume=True)
    with pytest.raises(UsageError, match="the options changed"):
        OutputDir.prepare(tmp_path, job="pdf", sources=SOURCES, options={"ocr": "text"},
                          resume=True)


def test_exit_codes_and_named_failures() -> None:
    summary = JobSummary(job="pdf", total=14)
    summary.add_ok(3)
    assert summary.exit_code() == EXIT_OK
    for i in range(13):
        summary.add_failed(f"f{i}.pdf", f"missing: f{i}.pdf does not exist")
    assert summary.exit_code() == EXIT_FAILED
    assert summary.exit_code(allow_failures=True) == EXIT_OK
    lines = summary.failure_lines()
    assert lines[0] == "  f0.pdf: missing: f0.pdf does not exist"
    assert len(lines) == 11 and lines[-1] == "  ... and 3 more (see documents.jsonl)"
    assert summary.failure_kinds() == {"missing": 13}
    assert "14/14 documents, 3 pages" in summary.progress_line()
    assert plural(1, "document") == "1 document" and plural(2, "failure") == "2 failures"


def test_a_summary_of_many_failures_holds_a_bounded_few_by_name() -> None:
    """A million failures are counted, not kept: the summary names the first
    MAX_KEPT_FAILURES by source, whatever order they came in."""
    summary = JobSummary(job="pdf", total=None)
    n = 5 * MAX_KEPT_FAILURES + 7
    for i in reversed(range(n)):
        summary.add_failed(f"f{i:06d}.pdf", "missing: gone" if i % 2 else "encrypted: locked")
        assert len(summary.named_failures) < 2 * MAX_KEPT_FAILURES
    assert summary.failed == n and summary.exit_code() == EXIT_FAILED
    assert summary.failure_kinds() == {"encrypted": n // 2 + 1, "missing": n // 2}
    named = summary.failures
    assert [s for s, _ in named] == [f"f{i:06d}.pdf" for i in range(MAX_KEPT_FAILURES)]
    assert summary.failure_lines()[-1] == f"  ... and {n - 10} more (see documents.jsonl)"


BAD_SCRIPT = """
import rayorch as ro

def render(pdfs):
    return pdfs

class Bad(ro.Pipeline):
    def __init__(self):
        super().__init__()
        self.render = ro.RayModule(render)

    def forward(self, pdfs):
        pages = self.render(pdfs)
        if pages:
            return pages
        return pages

Bad().compile()
"""


def test_a_compile_error_in_a_script_prints_the_line_and_fix_not_a_traceback(
    tmp_path: Path,
) -> None:
    script = tmp_path / "bad_pipeline.py"
    script.write_text(BAD_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          timeout=120, check=False)
    assert done.returncode == 1
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"SymbolicValueError: {script}:14: in forward: bool() of Port")
    assert "fix: " in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) <= 5, done.stderr


# -- the video job's layout: videos.jsonl rows, clips.jsonl lines, clips/ files -----------
VIDEOS = ["in/a.mp4", "in/b.mkv", "in/c.webm"]


def video_run(out: Path, clips: dict[int, int], *, resume: bool = False,
              run_id: str = "run-1") -> OutputDir:
    """A run of the video job writing ``clips[id]`` clips (with files) per ok video."""
    target = OutputDir.prepare(out, job=VIDEO_JOB, sources=VIDEOS, options={"annotate": "stats"},
                               resume=resume)
    sink = target.sink_for(run_id, VIDEO_WRITER)
    target.note_run(run_id)
    for index in [i for i in range(len(VIDEOS)) if i not in target.kept]:
        source = VIDEOS[index]
        if index not in clips:
            sink.write_part(0, [(index, failed(index, f"empty: {source} is an empty file"))])
            continue
        folder = out / "clips" / Path(source).stem
        folder.mkdir(parents=True, exist_ok=True)
        made = []
        for n in range(clips[index]):
            (folder / f"{n:04d}.mp4").write_bytes(b"clip")
            made.append({"clip": n, "file": str((folder / f"{n:04d}.mp4").resolve())})
        sink.write_part(0, [(index, {"path": source, "clips": made, "duration_s": 1.0,
                                     "fps": 25.0, "width": 8, "height": 8, "cuts": []})])
    return target


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_video_resume_keeps_finished_videos_with_their_clips_and_redoes_the_rest(
    tmp_path: Path,
) -> None:
    video_run(tmp_path, {1: 1, 2: 3}).finish(complete=True)
    (tmp_path / "clips" / "c" / "0001.mp4").unlink()  # lost since: c runs again
    with pytest.raises(UsageError, match="--resume to continue it"):
        OutputDir.prepare(tmp_path, job=VIDEO_JOB, sources=VIDEOS,
                          options={"annotate": "stats"})
    with pytest.raises(UsageError, match="the options changed"):
        OutputDir.prepare(tmp_path, job=VIDEO_JOB, sources=VIDEOS,
                          options={"annotate": "ocr"}, resume=True)
    kept_file = tmp_path / "clips" / "b" / "0000.mp4"
    stamp = kept_file.stat().st_mtime_ns
    out = video_run(tmp_path, {0: 2, 2: 2}, resume=True, run_id="run-2")
    assert sorted(out.kept) == [1]
    assert kept_file.stat().st_mtime_ns == stamp  # b's clip file is not written again
    out.finish(complete=True)
    rows = lines_of(tmp_path / "videos.jsonl")
    assert [(r["id"], r["status"], r["clips"]) for r in rows] == [
        (0, "ok", 2), (1, "ok", 1), (2, "ok", 2)]
    lines = lines_of(tmp_path / "clips.jsonl")  # per-video order, no line of the lost run
    assert [(line["video"], line["clip"]) for line in lines] == [
        ("in/a.mp4", 0), ("in/a.mp4", 1), ("in/b.mkv", 0), ("in/c.webm", 0), ("in/c.webm", 1)]
    files = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "clips").rglob("*.mp4"))
    assert files == sorted(line["file"] for line in lines)  # c's third clip file is gone


def test_video_resume_redoes_a_video_whose_clip_file_or_record_is_missing(
    tmp_path: Path,
) -> None:
    video_run(tmp_path, {0: 2, 1: 1}).finish(complete=False)  # killed before c's record
    (tmp_path / "clips.jsonl").write_text("")  # a view only: the part files are the record
    (tmp_path / "clips" / "b" / "0000.mp4").unlink()
    (tmp_path / "clips" / "c").mkdir()
    (tmp_path / "clips" / "c" / "0000.mp4").write_bytes(b"written before the kill")
    out = OutputDir.prepare(tmp_path, job=VIDEO_JOB, sources=VIDEOS,
                            options={"annotate": "stats"}, resume=True)
    assert sorted(out.kept) == [0]  # 1 and 2 run again
    assert [line["video"] for line in lines_of(tmp_path / "clips.jsonl")] == ["in/a.mp4"] * 2
    assert not (tmp_path / "clips" / "c").exists()  # named by no kept record: removed
    out.finish(complete=True)


def test_video_overwrite_removes_every_output_but_keeps_the_users_files(tmp_path: Path) -> None:
    video_run(tmp_path, {0: 2, 1: 1}).finish(complete=True)
    (tmp_path / "notes.txt").write_text("the user's own file")
    out = OutputDir.prepare(tmp_path, job=VIDEO_JOB, sources=VIDEOS[:1], options={},
                            overwrite=True)
    out.finish(complete=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".rayorch-output.json", "clips.jsonl", "notes.txt", "videos.jsonl"]
    assert (tmp_path / "clips.jsonl").read_text() == ""


def test_video_summary_words_and_exit_codes() -> None:
    summary = JobSummary(VIDEO_JOB, total=12, kept=1)
    summary.add_ok(4)
    assert summary.exit_code() == EXIT_OK
    for i in range(11):
        summary.add_failed(f"v{i}.mp4", f"not a video: v{i}.mp4")
    assert summary.exit_code() == EXIT_FAILED
    assert summary.exit_code(allow_failures=True) == EXIT_OK
    assert summary.failure_lines()[-1] == "  ... and 1 more (see videos.jsonl)"
    line = summary.progress_line()
    assert "13/12 videos, 4 clips" in line and "clips/s" in line and "11 failures" in line


@pytest.mark.parametrize(("job", "own", "other"), [
    ("video", ["--annotate", "--max-clip-s", "--write-clips", "--keyframes"],
     ["--ocr", "--dpi", "--tables", "--render-replicas"]),
    ("pdf", ["--ocr", "--dpi", "--tables", "--render-replicas"],
     ["--annotate", "--max-clip-s", "--write-clips", "--keyframes", "--decode-replicas"]),
])
def test_each_job_help_shows_its_own_options_and_the_shared_ones(
    job: str, own: list[str], other: list[str], capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        cli_main(["run", job, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    shared = ["--input", "--output", "--store", "--overwrite", "--resume", "--allow-failures",
              "--address", "--no-progress", "--progress-every", "--json"]
    assert all(f"{option} " in text for option in [*own, *shared]), text
    assert not [option for option in other if option in text], text
    with pytest.raises(SystemExit) as refused:  # the other job's option is a usage error
        cli_main(["run", job, "--input", "x", "--output", "y", other[0], "1"])
    assert refused.value.code == EXIT_USAGE
    assert f"unrecognized option {other[0]}" in capsys.readouterr().err


def test_resume_republishes_a_part_with_only_its_kept_records_and_audit_counts_them(
    tmp_path: Path,
) -> None:
    from rayorch.runtime.sink_audit import check_delivery

    first = OutputDir.prepare(tmp_path, job="pdf", sources=SOURCES, options={})
    sink = first.sink_for("run-1", PDF_WRITER)
    first.note_run("run-1")
    ok = [(i, {"path": SOURCES[i], "markdown": f"doc {i}", "pages": 1}) for i in (0, 2)]
    sink.write_part(0, [ok[0], (1, failed(1)), ok[1]])  # one part: ok, failed, ok
    first.finish(complete=True)
    [part] = tmp_path.glob("part-*.jsonl")
    lines = part.read_bytes().splitlines()

    again = OutputDir.prepare(tmp_path, job="pdf", sources=SOURCES, options={}, resume=True)
    assert sorted(again.kept) == [0, 2]
    [kept] = tmp_path.glob("part-*.jsonl")
    assert kept.name != part.name and kept.read_bytes().splitlines() == [lines[0], lines[2]]
    facts = again.sink_for("run-2", PDF_WRITER).write_part(0, [(1, failed(1, "still broken"))])
    again.note_run("run-2")
    again.finish(complete=True)
    assert check_delivery(tmp_path, facts, complete=True) == []  # the kept part: delivered
    manifest = tmp_path / "_rayorch_sink.json"
    meta = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**meta, "kept": []}))
    assert [f"part {kept.name} in {tmp_path} holds sources 0, 2 that no fact records: its "
            "driver died before recording them"] == [
        p.split(" (")[0] for p in check_delivery(tmp_path, facts, complete=True)]


def test_with_json_stdout_carries_the_summary_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """What Ray prints on stdout during a run (a raylet warning as pools that size
    themselves grow) goes to stderr: ``--json`` output stays one JSON document."""
    from rayorch.cli import build_parser
    from rayorch.pipelines.job import cli as job_cli
    from rayorch.pipelines.job.layouts import PDF_JOB

    class Handle:
        run_id, actors_up_at, pool_sizer = "r1", None, None
        stats = RunStats("r1")

        def __iter__(self) -> Any:
            print("(raylet) WARNING: 10 PYTHON worker processes have been started")
            return iter(())

    class Job(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            self.one = ro.RayModule(plural, replicas="auto")

        def forward(self, xs: Any) -> Any:
            return self.one(xs)

        def run(self, *args: Any, **kwargs: Any) -> Any:
            print("(raylet) WARNING: a pool grew")
            return Handle()

    monkeypatch.setattr(job_cli, "start_ray_for", lambda plan, address: "local")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.pdf").write_bytes(b"%PDF-1.4\n")
    args = build_parser().parse_args(["run", "pdf", "--input", str(tmp_path / "in"),
                                      "--output", str(tmp_path / "out"), "--json",
                                      "--no-progress"])
    capsys.readouterr()
    spec = job_cli.input_spec(args, (".pdf",), "PDF")
    job_cli.run_job(args, job=PDF_JOB, spec=spec, pipeline=Job(), options={},
                    writer=PDF_WRITER, engine=("--ocr", "auto"), outputs=lambda o, s: "")
    out, err = capsys.readouterr()
    assert json.loads(out)["pools"]["one"]["replicas"] == "auto"
    assert "a pool grew" in err and "10 PYTHON worker" in err


def test_a_slow_rate_keeps_its_digits_and_a_fast_one_one_decimal() -> None:
    from rayorch.pipelines.job.summary import format_rate

    assert format_rate(0.3127) == "0.313"  # OCR on a CPU: 0.3 would hide a 10% change
    assert format_rate(283.04) == "283.0" and format_rate(12.25) == "12.2"
    assert format_rate(None) == "-"


def test_actor_max_rss_reaches_the_native_stages_and_a_bad_one_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rayorch.pipelines.pdf import PdfPipeline
    from rayorch.pipelines.video import VideoPipeline

    def limits(pipeline: ro.Pipeline) -> dict[str, int | None]:
        return {m.name: m.options.max_rss for m in pipeline.compile().modules}

    assert limits(PdfPipeline("rapidocr", actor_max_rss="1.5GB")) == {
        "render": 1_500_000_000, "ocr": 1_500_000_000, "assemble": None}
    assert limits(PdfPipeline("auto"))["render"] == 3_000_000_000  # the default
    assert limits(PdfPipeline("rapidocr", actor_max_rss="off"))["render"] is None
    assert limits(VideoPipeline("stats", actor_max_rss=2**30))["decode"] == 2**30
    code = cli_main(["run", "pdf", "--input", str(REPO / "examples" / "pdfs"),
                     "--output", str(tmp_path / "out"), "--actor-max-rss", "lots"])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--actor-max-rss: actor max RSS 'lots': a size is a number of bytes" in err
    assert "Traceback" not in err


def test_a_price_that_is_not_dollars_per_hour_is_a_usage_error_before_any_output(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("-1", "nan", "inf"):
        code = cli_main(["run", "pdf", "--input", str(REPO / "examples" / "pdfs"),
                         "--output", str(tmp_path / "out"), "--gpu-price", bad])
        assert code == EXIT_USAGE
        assert f"--gpu-price is dollars per hour >= 0, not {float(bad)}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
