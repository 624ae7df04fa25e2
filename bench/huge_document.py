"""A scan of thousands of pages: rendered by one actor, or spread (issue 42, item 2).

Two measurements on one generated image-only PDF (``rayorch.testing_scans.write_scan``):

* ``render``: the render step alone, in a child process each, as a render actor runs it:
  ``RenderPages(ocr_fallback=True)`` (today's default: every page's PNG made and returned
  by the one actor that reads the document) against ``defer_images=True`` (``--spread-pages``:
  the pages leave without images). Peak RSS of the child and the size of what it returns.
* ``--run``: the whole job, ``rayorch run pdf --ocr auto`` with and without
  ``--spread-pages``, timed, with the peak RSS of every Ray worker process sampled every
  0.2 s (psutil): the largest any actor reached bounds every render actor's.

    python bench/huge_document.py --pages 3000                 # render step only
    python bench/huge_document.py --pages 3000 --run           # and the whole job, both ways
    python bench/huge_document.py --pages 3000 --run --only spread
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, msgpack
from rayorch.pipelines.document.render import RenderPages
t0 = time.perf_counter()
[out] = RenderPages(ocr_fallback=True, defer_images=sys.argv[2] == "1")([sys.argv[1]])
elapsed = time.perf_counter() - t0
pages, to_ocr, meta = out
print(json.dumps({"seconds": elapsed, "pages": len(pages), "to_ocr": sum(to_ocr),
                  "returned_bytes": len(msgpack.packb(out)),
                  # VmHWM, not ru_maxrss: Linux keeps the parent's ru_maxrss across exec
                  "peak_rss_mb": int(next(l for l in open("/proc/self/status")
                                          if l.startswith("VmHWM")).split()[1]) / 1024}))
"""


def render_step(pdf: Path, defer: bool) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(pdf), "1" if defer else "0"],
                          capture_output=True, text=True, check=True, cwd=REPO)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


class WorkerRss:
    """Peak RSS per Ray worker process (``ray::`` in its name), sampled in a thread."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.peaks: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        while not self._stop.is_set():
            for proc in psutil.process_iter(["pid", "name", "cmdline"]):
                try:
                    title = " ".join(proc.info["cmdline"] or [proc.info["name"] or ""])
                    if not title.startswith("ray::"):
                        continue
                    rss = proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                _, peak = self.peaks.get(proc.pid, ("", 0))
                self.peaks[proc.pid] = (title[:60], max(peak, rss))
            self._stop.wait(self._every)

    def __enter__(self) -> WorkerRss:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def whole_job(pdf: Path, spread: bool, work: Path) -> dict[str, Any]:
    out = work / ("out-spread" if spread else "out-plain")
    inputs = work / "input"
    inputs.mkdir(exist_ok=True)
    if not (inputs / pdf.name).exists():
        os.link(pdf, inputs / pdf.name)
    command = [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", str(inputs),
               "--output", str(out), "--ocr", "auto", "--no-progress", "--json",
               *(["--spread-pages"] if spread else [])]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.perf_counter()
    with WorkerRss() as rss:
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    elapsed = time.perf_counter() - t0
    peaks = sorted((peak for _, peak in rss.peaks.values()), reverse=True)
    row = {"spread": spread, "exit": done.returncode, "seconds": round(elapsed, 1),
           "workers": len(peaks),
           "peak_worker_rss_mb": round(peaks[0] / 2**20) if peaks else None,
           "worker_peaks_mb": [round(p / 2**20) for p in peaks[:8]]}
    if done.returncode != 0:
        row["stderr"] = done.stderr[-2000:]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--dpi", type=int, default=100, help="of the generated scan")
    parser.add_argument("--run", action="store_true", help="also the whole job, both ways")
    parser.add_argument("--only", choices=("plain", "spread"), default=None,
                        help="--run: the whole job one way only")
    parser.add_argument("--keep", type=Path, default=None, help="keep the scan here")
    args = parser.parse_args(argv)
    from rayorch.testing_scans import write_scan

    with tempfile.TemporaryDirectory(prefix="huge-document-") as tmp:
        work = Path(tmp)
        pdf = (args.keep or work) / f"scan-{args.pages}.pdf"
        t0 = time.perf_counter()
        if not pdf.exists():
            write_scan(pdf, args.pages, dpi=args.dpi)
        made = time.perf_counter() - t0
        print(f"scan: {args.pages} pages, {pdf.stat().st_size / 1e6:.1f} MB "
              f"(made in {made:.1f} s)")
        rows = []
        for defer in (False, True):
            r = render_step(pdf, defer)
            rows.append(r)
            how = "deferred images (--spread-pages)" if defer else "images in the render actor"
            print(f"render step, {how}: "
                  f"{r['seconds']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB, returns "
                  f"{r['returned_bytes'] / 1e6:.1f} MB for {r['pages']} pages "
                  f"({r['to_ocr']} to OCR)")
        print(f"render actor's peak RSS, images / deferred: "
              f"{rows[0]['peak_rss_mb'] / rows[1]['peak_rss_mb']:.1f}x; what it returns: "
              f"{rows[0]['returned_bytes'] / max(1, rows[1]['returned_bytes']):.0f}x")
        if args.run:
            ways = {None: (False, True), "plain": (False,), "spread": (True,)}[args.only]
            for spread in ways:
                r = whole_job(pdf, spread, work)
                print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
