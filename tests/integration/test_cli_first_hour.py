"""A newcomer's first hour with the CLI: the README's commands one after another, as written.

Each command is a real subprocess (stdout a pipe) with a real private Ray and a real
redis-server (the ``redis://localhost:6379/0`` of the README is this test's server).
``RAY_AUTH_MODE`` is unset, as on a user's machine (``HOME`` is the test's, so Ray's token
file lands there). Checked on the way: a wrong store URL fails before Ray starts and blocks
no retry; ``show RUN 3`` is document 3 although the largest files are dispatched first;
every page is a child in the lineage (show, status, timeline); one throughput figure; no
Ray auth warning; a closed pipe ends quietly; plurals. Then ``--resume``: a run of the
sources left keeps their ids in its lineage.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rayorch.testing import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

pytest.importorskip("pymupdf")
pytest.importorskip("rapidocr_onnxruntime")

REPO = Path(__file__).resolve().parents[2]
README_STORE = "redis://localhost:6379/0"


def user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    return {**env, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": str(REPO)}


def rayorch(cwd: Path, argv: list[str], *, stdout: Any = subprocess.PIPE
            ) -> subprocess.CompletedProcess[str]:
    """``rayorch ARGV`` (as ``python -m rayorch.cli``) in ``cwd`` with a user's environment."""
    return subprocess.run([sys.executable, "-m", "rayorch.cli", *argv], cwd=cwd,
                          env=user_env(cwd / "home"), stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=600, check=False)


def readme_commands() -> list[list[str]]:
    """The README's first command (the PDF job) and its "Durable runs" block, in order."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    first = next(b for b in blocks if "rayorch run pdf" in b)
    durable = next(b for b in blocks if "rayorch runs" in b)
    commands = []
    for line in [*first.splitlines()[:1], *durable.splitlines()]:
        line = line.split("&& ", 1)[-1].split("  #", 1)[0].strip()
        if line.startswith("rayorch "):
            commands.append(shlex.split(line)[1:])
    assert commands[0][:2] == ["run", "pdf"] and commands[1][:2] == ["run", "pdf"]
    return commands


def rows_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]


def rate_lines(done: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """The rate of the last progress line and of the summary."""
    progress = [line for line in done.stderr.splitlines() if "documents," in line]
    assert progress, done.stderr[-2000:]
    last = re.search(r"([\d.]+) pages/s after start-up", progress[-1])
    summary = re.search(r"after start-up = ([\d.]+) pages/s", done.stdout)
    assert last and summary, (progress[-1], done.stdout)
    return last[1], summary[1]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A user's directory holding the repository's ``examples`` (outputs land in ``out/``)."""
    (tmp_path / "home").mkdir()
    (tmp_path / "examples").symlink_to(REPO / "examples")
    return tmp_path


@pytest.mark.long
def test_the_readme_commands_run_one_after_another(workdir: Path, redis_url: str) -> None:
    commands = readme_commands()

    # A wrong store URL: one clear line, before Ray starts; --output is not touched.
    wrong = f"redis://127.0.0.1:{free_port()}/0"
    redis_run = [wrong if a == README_STORE else a for a in commands[1]]
    failed = rayorch(workdir, redis_run)
    assert failed.returncode == 2, failed.stderr
    assert f"rayorch run: cannot reach the lineage store at {wrong} (" in failed.stderr
    assert "starting Ray" not in failed.stderr and "Traceback" not in failed.stderr
    out_arg = redis_run[redis_run.index("--output") + 1]
    assert not (workdir / out_arg / ".rayorch-output.json").exists()

    run_id = ""
    outputs: dict[str, subprocess.CompletedProcess[str]] = {}
    for argv in commands:
        argv = [redis_url if a == README_STORE else run_id if a == "RUN" else a for a in argv]
        if argv[0] == "delete":  # before the run goes: a closed pipe, plurals
            check_before_delete(workdir, redis_url, run_id)
        done = rayorch(workdir, argv)
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-3000:])
        assert "Token authentication" not in done.stderr and "Traceback" not in done.stderr
        outputs.setdefault(argv[0], done)
        if argv[:2] == ["run", "pdf"] and "--store" in argv:
            found = re.search(r"^run (\S+) done:", done.stdout, flags=re.M)
            assert found, done.stdout
            run_id = found[1]
            outputs["run redis"] = done
    for done in (outputs["run"], outputs["run redis"]):  # one throughput figure
        last, summary = rate_lines(done)
        assert last == summary

    # `show RUN 3` is document 3 of the outputs, and its pages are its children.
    rows = rows_of(workdir / out_arg)
    third = rows[3]
    assert third["id"] == 3 and third["markdown"].startswith("00003-")
    sizes = sorted(((os.stat(workdir / r["source"]).st_size, -r["id"]) for r in rows),
                   reverse=True)
    assert [-i for _, i in sizes].index(3) != 3  # it was not dispatched fourth
    show = outputs["show"].stdout
    assert f"source 3: admitted with [{third['source']!r}]" in show
    assert f"expansion root/0: succeeded, {third['pages']} children" in show
    total = sum(r["pages"] for r in rows)
    assert f"domain root/0: {total} children of {len(rows)} parents" in outputs["status"].stdout
    assert (workdir / "run.png").stat().st_size > 0
    assert f"{total} children in root/0" in outputs["timeline"].stdout
    assert " in 1 shard" in outputs["audit"].stdout  # not "1 shards"


def check_before_delete(workdir: Path, redis_url: str, run_id: str) -> None:
    read, write = os.pipe()
    os.close(read)  # `rayorch show RUN 3 | head -1`, the reader gone before the first line
    try:
        piped = rayorch(workdir, ["show", run_id, "3", "--store", redis_url], stdout=write)
    finally:
        os.close(write)
    assert piped.returncode == 141 and piped.stderr == "", piped.stderr
    gc = rayorch(workdir, ["gc", "--older-than", "1s", "--dry-run", "--store", redis_url])
    assert gc.returncode == 0, gc.stderr
    assert gc.stdout.startswith("gc: would delete 1 run and 0 orphaned payload files\n")
    timeline = rayorch(workdir, ["timeline", run_id, "--store", redis_url, "--json"])
    totals = json.loads(timeline.stdout)["totals"]
    assert sum(totals["children"].values()) == sum(r["pages"] for r in rows_of(
        workdir / "out" / "pdf-redis"))


@pytest.mark.slow  # the default suite checks the ids on a killed job's resume (test_job_sink)
def test_a_resumed_run_keeps_the_document_ids_in_its_lineage(workdir: Path,
                                                            redis_url: str) -> None:
    """``--resume`` runs only the documents left; each keeps its id as its lineage index."""
    pdfs = workdir / "pdfs"
    pdfs.mkdir()
    for name in ("gb4e-doc.pdf", "parallel.pdf", "qtree-qarrows.pdf"):
        shutil.copy(REPO / "examples" / "pdfs" / name, pdfs / name)
    (pdfs / "parallel.pdf").write_bytes(b"not a PDF yet\n")  # id 1 fails the first time
    argv = ["run", "pdf", "--input", "pdfs", "--output", "out", "--store", redis_url]
    first = rayorch(workdir, argv)
    assert first.returncode == 1, first.stderr[-2000:]
    shutil.copy(REPO / "examples" / "pdfs" / "parallel.pdf", pdfs / "parallel.pdf")
    again = rayorch(workdir, [*argv, "--resume"])
    assert again.returncode == 0, again.stderr[-2000:]
    found = re.search(r"^run (\S+) done: 3 documents \(3 ok, 0 failed, 2 kept", again.stdout,
                      flags=re.M)
    assert found, again.stdout
    show = rayorch(workdir, ["show", found[1], "1", "--store", redis_url])
    assert show.returncode == 0, show.stderr
    assert "source 1: admitted with ['pdfs/parallel.pdf']" in show.stdout
    assert rows_of(workdir / "out")[1]["status"] == "ok"
    not_run = rayorch(workdir, ["show", found[1], "0", "--store", redis_url])
    assert not_run.returncode == 1 and "no facts about entity 0" in not_run.stdout


@pytest.mark.long
def test_the_quickstart_prints_outcomes_in_words(tmp_path: Path) -> None:
    """``python examples/quickstart.py`` (memory store): a failed document reads as words,
    and nothing suggests auditing a lineage that ended with the script."""
    script = REPO / "examples" / "quickstart.py"
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path,
                          env=user_env(tmp_path), capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "doc 2: suppressed: shout[2.0] failed: this page is unreadable\n" in done.stdout
    assert "FailedResult(" not in done.stdout and "Outcome." not in done.stdout
    assert "doc 0: RAY RUNS TASKS! ACTORS KEEP STATE!\n" in done.stdout
    assert "rayorch audit" not in done.stdout
    assert "its lineage was in memory, gone when this script ends" in done.stdout
    docstring = script.read_text().split('"""')[1]
    assert "rayorch audit RUN --store redis://" in docstring  # only for the Redis variant
