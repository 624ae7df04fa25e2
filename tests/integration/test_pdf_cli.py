"""``rayorch run pdf`` as a user meets it, each run a real subprocess with stdout a pipe.

While every run here happens, a second Ray cluster (``ray start --head --block``,
stopped at teardown by PID) runs on the machine and is discoverable the way Ray
finds clusters (its ``ray_current_cluster`` file, under a ``RAY_TMPDIR`` private to
these tests, so other people's Ray processes never see it). Runs must start their
own private Ray anyway, unless told to attach.

Covered: a scanned page gets its text by default (``--ocr auto``); progress lines
when piped; exit codes (some failed, all failed, ``--allow-failures``, usage);
re-runs into the same ``--output`` (refused, ``--resume``, ``--overwrite``, no stale
files); the README's ``Pipeline.run`` not attaching; ``RAY_ADDRESS`` attaching.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rayorch.runtime.sinks import read_outputs
from rayorch.testing import free_port, word_recall, write_scanned_pdf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

pymupdf: Any = pytest.importorskip("pymupdf")
pytest.importorskip("rapidocr_onnxruntime")
psutil: Any = pytest.importorskip("psutil")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "pdfs"
SCANNED_FROM = EXAMPLES / "qtree-qarrows.pdf"


# -- a second Ray cluster on the machine ------------------------------------------------
class OtherCluster:
    """``ray start --head --block`` in a subprocess; stopped by PID (never ``ray stop``)."""

    def __init__(self, tmpdir: str) -> None:
        self.tmpdir = tmpdir
        self.port = free_port()
        self.env = {**os.environ, "RAY_TMPDIR": tmpdir, "RAY_AUTH_MODE": "disabled",
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
             f"--port={self.port}", "--num-cpus=2", "--include-dashboard=false",
             "--disable-usage-stats"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        address_file = Path(tmpdir) / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 180
        while not address_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("the second Ray cluster (ray start --head) did not come up")
            time.sleep(0.5)
        self.address = address_file.read_text().strip()

    def stop(self) -> None:
        try:
            family = [self.proc.pid] + [p.pid for p in
                                        psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            family = [self.proc.pid]
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        for pid in family:  # whatever outlived the SIGTERM: only processes it started
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def other_cluster() -> Iterator[OtherCluster]:
    tmpdir = tempfile.mkdtemp(prefix="ro-other-", dir="/tmp")  # short: Ray's socket paths
    cluster = OtherCluster(tmpdir)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)


def run_cli(cluster: OtherCluster, *args: str, env: dict[str, str] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m rayorch.cli ARGS`` with stdout and stderr pipes, beside ``cluster``."""
    full_env = {**cluster.env, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "rayorch.cli", *args], cwd=REPO,
                          env=full_env, capture_output=True, text=True, timeout=timeout,
                          check=False)


# -- inputs -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pdf-cli")
    mixed = root / "mixed"
    mixed.mkdir()
    shutil.copyfile(EXAMPLES / "qtree-qarrows.pdf", mixed / "a-digital.pdf")
    expected = write_scanned_pdf(SCANNED_FROM, mixed / "b-scanned.pdf")
    (mixed / "c-broken.pdf").write_bytes(b"not a PDF at all\n" * 10)
    bad = root / "bad"
    bad.mkdir()
    (bad / "x.pdf").write_bytes(b"")
    (bad / "y.pdf").write_bytes(b"%PDF-1.4\ngarbage")
    return {"mixed": mixed, "bad": bad, "scanned_text": expected, "root": root}


def rows_of(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "documents.jsonl").read_text().splitlines()]


# -- the tests ----------------------------------------------------------------------------
@pytest.mark.long
def test_scanned_page_gets_text_by_default_with_progress_when_piped(
    other_cluster: OtherCluster, inputs: dict[str, Any]
) -> None:
    out = inputs["root"] / "out"
    done = run_cli(other_cluster, "run", "pdf", "--input", str(inputs["mixed"]), "--output",
                   str(out), "--progress-every", "0.5")
    # One document failed: exit 1, and the summary names it with its cause.
    assert done.returncode == 1, done.stderr[-3000:]
    rows = rows_of(out)
    assert [r["status"] for r in rows] == ["ok", "ok", "failed"]
    # The largest files are dispatched first; rows and names keep the input order.
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert [r["markdown"][:6] for r in rows[:2]] == ["00000-", "00001-"]
    broken = rows[2]
    assert f"  {broken['source']}: {broken['cause']}" in done.stdout
    assert "3 documents (2 ok, 1 failed)" in done.stdout

    # The scanned page was OCR'd by rapidocr without asking, and says so.
    scanned = rows[1]
    assert scanned["page_engines"] == ["rapidocr"] and scanned["empty_pages"] == []
    markdown = (out / scanned["markdown"]).read_text()
    assert "<!-- page 1 engine=rapidocr -->" in markdown
    assert word_recall(inputs["scanned_text"], markdown) > 0.8, markdown
    assert rows[0]["page_engines"] == ["text"]

    # Piped: start-up lines, then progress lines every 0.5 s, on stderr.
    err = done.stderr
    assert "rayorch: starting Ray..." in err
    assert "rayorch: starting 3 pools (render auto, ocr auto, assemble x1)..." in err
    progress = [line for line in err.splitlines() if "/3 documents" in line]
    assert progress, err[-3000:]
    assert all("pages/s" in line and "failure" in line for line in progress)
    # It started its own Ray although another cluster is discoverable.
    assert "attaching" not in err


@pytest.mark.long
def test_rerun_into_the_same_output_is_refused_resumed_or_overwritten(
    other_cluster: OtherCluster, inputs: dict[str, Any]
) -> None:
    out = inputs["root"] / "out"
    if not (out / "documents.jsonl").exists():
        pytest.skip("needs the output of the scanned-page test")
    before = rows_of(out)
    refused = run_cli(other_cluster, "run", "pdf", "--input", str(inputs["mixed"]),
                      "--output", str(out))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--overwrite" in refused.stderr
    assert rows_of(out) == before

    # --resume: the two good documents are kept, the broken one runs again (and fails
    # again); --allow-failures keeps the exit code 0.
    resumed = run_cli(other_cluster, "run", "pdf", "--input", str(inputs["mixed"]),
                      "--output", str(out), "--resume", "--allow-failures", "--json",
                      "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout)
    assert (summary["kept"], summary["succeeded"], summary["failed"]) == (2, 2, 1)
    assert rows_of(out)[:2] == before[:2]

    # --overwrite with inputs that all fail: exit 1, no document of the earlier run left.
    replaced = run_cli(other_cluster, "run", "pdf", "--input", str(inputs["bad"]),
                       "--output", str(out), "--overwrite", "--no-progress")
    assert replaced.returncode == 1, replaced.stderr[-3000:]
    assert "2 documents (0 ok, 2 failed)" in replaced.stdout
    # Failed files are named in input order (y.pdf is larger, so it was dispatched first).
    assert 0 <= replaced.stdout.index("x.pdf: ") < replaced.stdout.index("y.pdf: ")
    assert "no .md written" in replaced.stdout and "one .md per document" not in replaced.stdout
    names = sorted(p.name for p in out.iterdir())  # no .md of the earlier run, no part of it
    assert [n for n in names if not n.startswith("part-")] == [
        ".rayorch-output.json", "_rayorch_sink.json", "documents.jsonl"]
    assert [r["status"] for r in rows_of(out)] == ["failed", "failed"]
    records = sorted(read_outputs(out), key=lambda r: r["index"])  # this run's, not kept ones
    assert [r["index"] for r in records] == [0, 1]
    assert [r["cause"] for r in records] == [r["cause"] for r in rows_of(out)]


def test_usage_errors_exit_2(other_cluster: OtherCluster, tmp_path: Path) -> None:
    missing = run_cli(other_cluster, "run", "pdf", "--input", str(tmp_path / "none"),
                      "--output", str(tmp_path / "o"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    both = run_cli(other_cluster, "run", "pdf", "--input", str(EXAMPLES), "--output",
                   str(tmp_path / "o"), "--overwrite", "--resume")
    assert both.returncode == 2 and "exclude each other" in both.stderr


README_SNIPPET = """
import ray
import rayorch as ro

def double(xs):
    return [2 * x for x in xs]

class Twice(ro.Pipeline):
    def __init__(self):
        super().__init__()
        self.double = ro.RayModule(double, num_cpus=0.25)

    def forward(self, xs):
        return self.double(xs)

print(sorted(Twice().run([1, 2, 3], store="memory://", progress=False, quiet=True)))
print("GCS", ray.get_runtime_context().gcs_address)
"""
LISTENING = """
import psutil
me = psutil.Process()
found = set()
for proc in [me, *me.children(recursive=True)]:
    try:
        found |= {c.laddr.ip for c in proc.net_connections(kind="inet")
                  if c.status == psutil.CONN_LISTEN}
    except psutil.Error:
        pass
print("LISTEN", sorted(found))
"""


@pytest.mark.long
def test_pipeline_run_starts_a_private_loopback_ray_or_attaches_when_told(
    other_cluster: OtherCluster, tmp_path: Path
) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(README_SNIPPET + LISTENING)
    env = {**other_cluster.env, "PYTHONPATH": str(REPO)}
    own = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert own.returncode == 0, own.stderr[-3000:]
    assert "[(0, 2), (1, 4), (2, 6)]" in own.stdout
    gcs = own.stdout.split("GCS ")[1].split()[0]
    assert gcs.startswith("127.0.0.1:") and not gcs.endswith(f":{other_cluster.port}")
    # Every process of the Ray it started (GCS, raylet, workers, agents) on loopback only.
    listening = own.stdout.split("LISTEN ")[1].splitlines()[0]
    assert set(eval(listening)) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, listening
    assert "127.0.0.1" in listening

    attached = subprocess.run([sys.executable, str(script)],
                              env={**env, "RAY_ADDRESS": other_cluster.address},
                              capture_output=True, text=True, timeout=600, check=False)
    assert attached.returncode == 0, attached.stderr[-3000:]
    assert attached.stdout.split("GCS ")[1].split()[0].endswith(f":{other_cluster.port}")
    assert (f"rayorch: attaching to the Ray cluster at {other_cluster.address} "
            "(from RAY_ADDRESS)") in attached.stderr
