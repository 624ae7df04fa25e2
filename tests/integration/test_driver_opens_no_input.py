"""The driver opens no input file: ``rayorch run pdf`` lists its inputs (names, sizes,
identities from metadata) and the render actors read them (issue 38, item 1).

A real ``rayorch run pdf`` subprocess, with a ``sitecustomize`` on its path that installs a
Python audit hook in every Python process of the run (the driver and Ray's workers): each
``open`` of a file under the input directory is written down with the opener's process id.
The render actors' opens (they hash each PDF they read) show that the hook is live; the
driver's process id must not appear.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rayorch.testing import one_page_pdf
from rayorch.testing_cli import cli_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

pytest.importorskip("pymupdf")

HOOK = '''
import os, sys
_watch = os.environ.get("RAYORCH_TEST_WATCH_DIR")
_log = os.environ.get("RAYORCH_TEST_OPEN_LOG")
if _watch and _log:
    def _hook(event, args):
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.startswith(_watch) and path.endswith(".pdf"):
                fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
                os.write(fd, f"{os.getpid()}\\t{path}\\n".encode())
                os.close(fd)
    sys.addaudithook(_hook)
'''


def test_the_pdf_job_driver_opens_no_input_file(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(6):
        (inputs / f"doc{i}.pdf").write_bytes(one_page_pdf(i))
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOOK)
    log = tmp_path / "opens.log"
    env = cli_env()
    env |= {"PYTHONPATH": f"{hook}:{env['PYTHONPATH']}", "RAYORCH_TEST_WATCH_DIR": str(inputs),
            "RAYORCH_TEST_OPEN_LOG": str(log)}
    proc = subprocess.Popen([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text",
                             "--input", str(inputs), "--output", str(tmp_path / "out"),
                             "--json", "--no-progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=500)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out)["succeeded"] == 6
    opens = [line.split("\t") for line in log.read_text().splitlines()]
    assert {path for _, path in opens} == {str(p) for p in inputs.iterdir()}  # the actors'
    assert [path for pid, path in opens if int(pid) == proc.pid] == []  # the driver's: none
