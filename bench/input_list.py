"""A one-million-row ``--input-list``: time to first dispatch and the driver's memory.

    python -m bench.input_list [--rows 1000000] [--job] [--to-end]

Writes a JSONL.zst manifest of ``--rows`` rows (url, size and two metadata columns; the
first rows name the example PDFs, the rest files that do not exist). In this process:
:class:`~rayorch.pipelines.inputs.InputStream` until its first source (what the job admits
first), then every row to the end, each released as a delivery releases it; RSS sampled
throughout (psutil). With ``--job``: ``rayorch run pdf --ocr text --input-list`` from its
start to the first ``.md``, its RSS then and at its peak until then, then killed. With
``--to-end``: the whole job to its end on a redis-server of its own with ``--archive``
(every row once, metadata carried, the driver's peak RSS, Redis after). JSON to
``bench/out/input_list.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "pdfs"


def write_manifest(path: Path, rows: int) -> None:
    import zstandard

    pdfs = sorted(EXAMPLES.glob("*.pdf"))
    with open(path, "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as out:
        for i in range(rows):
            if i < len(pdfs):
                row = {"url": str(pdfs[i]), "size": pdfs[i].stat().st_size}
            else:
                row = {"url": f"/nonexistent/corpus/{i:09d}.pdf", "size": 1000 + i % 977}
            row |= {"license": "cc-by", "crawl": f"2024-{1 + i % 12:02d}"}
            out.write((json.dumps(row) + "\n").encode())


class Peak:
    """The highest RSS of process ``pid`` seen, sampled every 50 ms in a thread."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except Exception:
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def job_first_md(manifest: Path, out: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text",
                             "--input-list", str(manifest), "--output", str(out),
                             "--no-progress"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    peak = Peak(proc.pid)
    try:
        while not any(out.glob("*.md")):
            if proc.poll() is not None:
                raise SystemExit("the job ended before its first document")
            time.sleep(0.05)
        first = time.perf_counter() - t0
        rss = peak.proc.memory_info().rss
    finally:
        top = peak.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)
    return {"first_md_s": round(first, 2), "driver_rss_mb_at_first": round(rss / 2**20),
            "driver_rss_mb_peak": round(top / 2**20)}


def job_to_end(manifest: Path, work: Path, rows: int) -> dict[str, Any]:
    """The whole job over the manifest, on a redis-server of its own with ``--archive``:
    every row delivered (the missing files each failed alone, with their cause), metadata
    carried to ``documents.jsonl``; the driver's peak RSS and Redis after the run."""
    import redis

    from rayorch.testing import RedisServer

    (work / "redis").mkdir()
    server = RedisServer(work / "redis")
    server.start()
    out = work / "out-end"
    try:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env |= {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
                "RAY_USAGE_STATS_ENABLED": "0"}
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr",
                                 "text", "--input-list", str(manifest), "--output", str(out),
                                 "--store", server.url, "--archive", str(work / "archive"),
                                 "--no-progress", "--json"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        peak = Peak(proc.pid)
        stdout, stderr = proc.communicate()
        top = peak.stop()
        wall = time.perf_counter() - t0
        used = int(redis.Redis.from_url(server.url).info("memory")["used_memory"])
    finally:
        server.stop()
    try:
        summary = json.loads(stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"the job printed no summary: {stderr[-2000:]}") from None
    ids, with_metadata = [], 0
    with open(out / "documents.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            ids.append(row["id"])
            with_metadata += bool(row.get("metadata"))
    return {"exit": proc.returncode, "wall_s": round(wall, 1), "run_s": summary.get("run_s"),
            "documents": summary.get("documents"), "succeeded": summary.get("succeeded"),
            "failures": summary.get("failures"), "rows_once": sorted(ids) == list(range(rows)),
            "rows_with_metadata": with_metadata, "driver_rss_mb_peak": round(top / 2**20),
            "redis_used_mb_after": round(used / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--job", action="store_true")
    parser.add_argument("--to-end", action="store_true",
                        help="also the whole job to its end (Redis and --archive)")
    args = parser.parse_args()

    from rayorch.pipelines.inputs import InputSpec, InputStream

    result: dict[str, Any] = {"rows": args.rows}
    with tempfile.TemporaryDirectory() as work:
        manifest = Path(work) / "list.jsonl.zst"
        write_manifest(manifest, args.rows)
        result["manifest_mb"] = round(manifest.stat().st_size / 2**20, 1)
        peak = Peak(os.getpid())
        t0 = time.perf_counter()
        stream = InputStream(InputSpec(str(manifest), (".pdf",), "PDF", manifest=True))
        count = 0
        for index, *_ in stream:
            if count == 0:
                result["first_source_s"] = round(time.perf_counter() - t0, 3)
            count += 1
            stream.release(index)
        result["all_rows_s"] = round(time.perf_counter() - t0, 1)
        assert count == args.rows == stream.listed, (count, stream.listed)
        result["rss_growth_mb"] = round((peak.stop() - peak.start) / 2**20, 1)
        if args.job:
            result["job"] = job_first_md(manifest, Path(work) / "out")
        if args.to_end:
            result["to_end"] = job_to_end(manifest, Path(work), args.rows)
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "input_list.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
