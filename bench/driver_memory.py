"""Driver RSS against completed sources (docs/ARCHITECTURE.md, "Bounded driver memory").

A tiny pipeline (one Call doubling an int, no sleeps) runs N sources on the in-process
memory store through ``Pipeline.run``; the caller drops every result as it arrives.
Each N runs in a fresh process: Ray is started and a 200-source warm-up run loads
everything first, so the figures are growth over that baseline:

* ``during``: RSS growth when the last result arrived (driver, kernel, memory store);
* ``closed``: after ``handle.close()`` and a garbage collection (the handle still held);
* ``dropped``: after ``del handle`` as well.

Python keeps freed small objects in its own arenas, so RSS after a release can stay
above what is live; ``heap`` (``sys.getallocatedblocks``) counts live objects.

    python -m bench.driver_memory [--sources 10000 100000 1000000] [--json FILE]

Works on any checkout (it only uses the public API): ``PYTHONPATH=/other/tree python
bench/driver_memory.py`` measures that tree.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import rayorch as ro

MB = 1 << 20


def double(values: list[int]) -> list[int]:
    return [2 * v for v in values]


class Tiny(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.double = ro.RayModule(double, batch_size=256, num_cpus=0.5)

    def forward(self, x: ro.Port) -> ro.Port:
        return self.double(x)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def drive(pipeline: Tiny, sources: int) -> tuple[Any, int]:
    handle = pipeline.run(range(sources), ordered=False, quiet=True, progress=False)
    count = 0
    for _ in handle:
        count += 1
    assert count == sources, (count, sources)
    return handle, count


def measure(sources: int) -> dict[str, Any]:
    """One N in this process (a fresh one: see ``main``)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    pipeline = Tiny()
    handle, _ = drive(pipeline, 200)  # imports, Ray workers, first allocations
    handle.close()
    del handle
    gc.collect()
    base, base_heap = rss(), sys.getallocatedblocks()
    started = time.perf_counter()
    handle, _ = drive(pipeline, sources)
    took = time.perf_counter() - started
    during, during_heap = rss(), sys.getallocatedblocks()
    handle.close()
    gc.collect()
    closed, closed_heap = rss(), sys.getallocatedblocks()
    del handle
    gc.collect()
    dropped, dropped_heap = rss(), sys.getallocatedblocks()
    ray.shutdown()
    return {
        "sources": sources, "seconds": round(took, 1),
        "sources_per_s": round(sources / took), "base_mb": round(base / MB, 1),
        "during_mb": round((during - base) / MB, 1), "closed_mb": round((closed - base) / MB, 1),
        "dropped_mb": round((dropped - base) / MB, 1),
        "heap_during_k": round((during_heap - base_heap) / 1000),
        "heap_closed_k": round((closed_heap - base_heap) / 1000),
        "heap_dropped_k": round((dropped_heap - base_heap) / 1000),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one)), flush=True)
        return
    rows = []
    print(f"rayorch from {os.path.dirname(os.path.dirname(ro.__file__))}")
    print(f"{'sources':>9} {'s':>7} {'src/s':>7} {'base MB':>8} {'+during':>8} {'+closed':>8} "
          f"{'+dropped':>9}   live objects (k): during/closed/dropped")
    for n in args.sources:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", str(n)],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"{n:>9} failed:\n{out.stderr[-2000:]}", flush=True)
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{row['sources']:>9} {row['seconds']:>7} {row['sources_per_s']:>7} "
              f"{row['base_mb']:>8} {row['during_mb']:>8} {row['closed_mb']:>8} "
              f"{row['dropped_mb']:>9}   {row['heap_during_k']}/{row['heap_closed_k']}/"
              f"{row['heap_dropped_k']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
