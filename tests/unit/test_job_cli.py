"""The shared job-command rules, without Ray: output directory, summary, exit codes, hook."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rayorch.pipelines.job_cli import (
    EXIT_FAILED,
    EXIT_OK,
    JobSummary,
    OutputDir,
    UsageError,
    plural,
)

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["a.pdf", "b.pdf", "c.pdf"]


def finished_run(out: Path, statuses: list[str]) -> None:
    """An earlier run into ``out``: one file per ok document, one row per document."""
    target = OutputDir.prepare(out, job="pdf", sources=SOURCES, options={"ocr": "auto"})
    for index, status in enumerate(statuses):
        row = {"id": index, "source": SOURCES[index], "status": status, "markdown": None}
        if status == "ok":
            row["markdown"] = target.write_document(index, Path(SOURCES[index]).stem, ".md",
                                                    f"doc {index}")
        target.add_row(row)
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
    assert sorted(out.kept) == [0] and out.remaining(SOURCES) == [1, 2]
    assert sorted(p.name for p in tmp_path.glob("*.md")) == ["00000-a.md"]
    out.add_row({"id": 2, "source": "c.pdf", "status": "ok", "markdown": None})
    out.add_row({"id": 1, "source": "b.pdf", "status": "failed", "markdown": None})
    out.finish(complete=True)
    rows = [json.loads(line) for line in (tmp_path / "documents.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [0, 1, 2]


def test_resume_refuses_other_inputs_or_options(tmp_path: Path) -> None:
    finished_run(tmp_path, ["ok", "ok", "ok"])
    with pytest.raises(UsageError, match="the --input files changed"):
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
