"""The ``rayorch`` command line as a newcomer types it, without Ray: typos, ``--version``,
a reader that stops early, optional extras that are not installed, a run that never
started."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import rayorch
from rayorch.cli import EXIT_BROKEN_PIPE
from rayorch.cli import main as cli_main
from rayorch.pipelines.job.cli import EXIT_USAGE, OutputDir

REPO = Path(__file__).resolve().parents[2]


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as refused:
        cli_main(list(argv))
    assert refused.value.code == EXIT_USAGE
    return capsys.readouterr().err


def test_a_mistyped_option_is_named_with_its_closest_match(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--ouput`` is not "--output is required"; ``--overwite`` is not the top-level usage."""
    err = usage_error(capsys, "run", "pdf", "--input", "x", "--ouput", "y")
    assert "unrecognized option --ouput: did you mean --output?" in err
    assert "required" not in err
    err = usage_error(capsys, "run", "pdf", "--input", "x", "--output", "y", "--overwite")
    assert err.startswith("usage: rayorch run pdf ")
    assert "rayorch run pdf: error: unrecognized option --overwite: did you mean --overwrite?" \
        in err
    err = usage_error(capsys, "show", "RUN", "3", "--sotre", "memory://")
    assert err.startswith("usage: rayorch show ") and "did you mean --store?" in err
    # A stray word is reported by the sub-command, with its own usage.
    err = usage_error(capsys, "run", "pdf", "--input", "x", "--output", "y", "extra")
    assert err.startswith("usage: rayorch run pdf ")
    assert "unrecognized arguments: extra" in err
    # Abbreviations argparse accepts still work, and nothing is said about values.
    err = usage_error(capsys, "run", "pdf", "--input-l", "x")
    assert "the following arguments are required: --output" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli_main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"rayorch {rayorch.__version__}\n"


def run_with_closed_stdout(code: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` whose stdout is a pipe nobody reads any more (``| head -1``)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-c", code], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False,
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write)


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    """``rayorch runs --store ... | head -1``: the command ends quietly (exit 141)."""
    done = run_with_closed_stdout("import sys\nfrom rayorch.cli import main\n"
                                  "sys.exit(main(['runs', '--store', 'memory://']))\n")
    assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    assert done.stderr == ""


def test_a_missing_extra_is_named() -> None:
    """Without the redis client a Redis store names the ``redis`` extra; without matplotlib
    the timeline picture names ``timeline``; the memory path imports neither."""
    code = (
        "import sys\n"
        "sys.modules['redis'] = None\n"
        "sys.modules['matplotlib'] = None\n"
        "from rayorch.cli import main\n"
        "assert main(['runs', '--store', 'redis://127.0.0.1:1/0']) == 2\n"
        "from rayorch.inspect.timeline import compute_timeline, draw_timeline\n"
        "try:\n"
        "    draw_timeline(compute_timeline('r', {}), 'x.png')\n"
        "except Exception as exc:\n"
        "    print('timeline:', exc, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert ("rayorch runs: a redis:// lineage store needs the redis client, which is not "
            "installed: pip install 'rayorch[redis]'") in done.stderr
    assert "timeline: drawing a timeline (rayorch timeline -o FILE.png) needs matplotlib, " \
           "which is not installed: pip install 'rayorch[timeline]'" in done.stderr

    memory_only = (
        "import sys\n"
        "import rayorch, rayorch.cli, rayorch.driver, rayorch.pipelines.job.run_command\n"
        "import rayorch.pipelines.pdf, rayorch.replicas, rayorch.inspect.timeline\n"
        "from rayorch.store import open_store\n"
        "open_store('memory://x').close()\n"
        "print(sorted(m for m in ('redis', 'matplotlib') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", memory_only], capture_output=True,
                          text=True, timeout=120, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"


def test_the_install_is_what_the_pdf_job_needs() -> None:
    """Plain Ray, no redis client and no matplotlib by default; extras for both; ``dev``
    installs what the default suite imports."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "ray[" not in core and "redis" not in core and "matplotlib" not in core
    extras = project["optional-dependencies"]
    assert any(d.startswith("redis") for d in extras["redis"])
    assert any(d.startswith("matplotlib") for d in extras["timeline"])
    dev = " ".join(extras["dev"])
    for needed in ("redis", "matplotlib", "psutil", "pyarrow"):
        assert needed in dev


def test_a_run_that_never_started_leaves_no_marker(tmp_path: Path) -> None:
    """Ray or the store failed before the run began: a retry is not refused."""
    out = tmp_path / "out"
    first = OutputDir.prepare(out, job="pdf", sources=["a.pdf"], options={})
    first.finish(False)  # no run was noted: nothing ran
    assert list(out.iterdir()) == []
    again = OutputDir.prepare(out, job="pdf", sources=["a.pdf"], options={})  # not refused
    again.note_run("run-1")
    again.finish(False)
    assert "incomplete" in (out / ".rayorch-output.json").read_text()
