"""Redis memory with finished lineage archived (issue 37): does it follow the work in flight?

A synthetic region-shaped run written through the real Redis store (no Ray, no models: the
facts a run of ``render -> expand(10 children) -> ocr -> reduce -> assemble`` writes, in the
order a driver writes them), on a fresh ``redis-server`` of its own with ``archive=`` in a
temporary directory. Micro-batches go round the shards in order, one at a time; with
``archive=``, every ``--every`` facts a shard's driver appends, its facts so far are archived
and trimmed, with the Grain table entries of the sources whose delivery they hold (the rest
at the end, when the shards are done). After every micro-batch ``INFO memory`` is read: the
peak growth over the run's start is what Redis needs. Run at several sizes, the peaks are
compared with the smallest one's (the issue bounds 200,000 against 20,000 sources at 1.2x);
the same pipeline without ``archive=`` is the baseline.

    python bench/lineage_archive.py --sources 2000 20000            # with and without archive
    python bench/lineage_archive.py --sources 20000 200000 --every 5000 --no-baseline

``--shape regions --window W`` runs the region path instead (``render -> expand(pages) ->
layout -> expand(regions) -> rec -> reduce -> page -> reduce -> assemble``, about the 19
facts per page of a real ``--ocr layout`` run) with ``W`` micro-batches in flight at once,
each a step further every tick, and reports Redis per *page in flight* (pages whose
children are dispatched and whose source is not delivered yet) at the peak of pages in
flight: what issue 37 bounds at 1 KB on the region path.

    python bench/lineage_archive.py --shape regions --window 8 --sources 2000 --every 2000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from rayorch.core.facts import (
    REPORT_PRESENT,
    ExpansionClosed,
    GrainCommitted,
    GrainDispatched,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.vocabulary import EXPANSION_SUCCEEDED, Outcome
from rayorch.store.registry import open_store
from rayorch.store.scripted_run import scripted_plan
from rayorch.testing import RedisServer

CHILDREN = 10
GRAINS_PER_SOURCE = 2 + CHILDREN  # render, 10 ocr, assemble


DRIVER = "bench-driver"


def write_batch(store: Any, run_id: str, shard: int, epoch: int, part: list[int]) -> None:
    """One micro-batch of sources, as a driver and its workers write them."""
    now = time.time  # every fact carries its time, as a driver's and a worker's do

    def append(facts: list[Any]) -> None:
        store.append(run_id, shard, epoch, facts, driver=DRIVER)

    srcs = [(i,) for i in part]
    append([f for i in part for f in (SourceAdmitted(i, (f"doc{i}.pdf",), ts=now()),
                                       GrainDispatched("render", (i,), 0, ts=now()))])
    store.commit(run_id, [GrainCommitted("render", s, 0, REPORT_PRESENT,
                                         ([f"r{o}" for o in range(CHILDREN)],), ts=now())
                          for s in srcs])
    kids = [(i, o) for i in part for o in range(CHILDREN)]
    append([ExpansionClosed("root/0", s, EXPANSION_SUCCEEDED, CHILDREN, ts=now())
            for s in srcs] + [GrainDispatched("ocr", k, 0, ts=now()) for k in kids])
    store.commit(run_id, [GrainCommitted("ocr", k, 0, REPORT_PRESENT, (f"t{k[1]}",), ts=now())
                          for k in kids])
    append([GrainDispatched("assemble", s, 0, ts=now()) for s in srcs])
    store.commit(run_id, [GrainCommitted("assemble", s, 0, REPORT_PRESENT, ("doc",), ts=now())
                          for s in srcs])
    append([OutputEmitted(i, Outcome.PRESENT.value, ts=now()) for i in part])


class SyntheticRun:
    """A run written by hand into the real Redis store: a ``redis-server`` of its own (with
    ``archive=`` in a temporary directory), the run opened, every shard's lease taken.
    :meth:`finish` completes it as a driver would; ``base`` is ``used_memory`` at the start."""

    def __init__(self, run_id: str, plan: Any, *, shards: int, micro_batch: int, every: int,
                 archive: bool) -> None:
        self.run_id, self.plan, self.shards, self.micro_batch = run_id, plan, shards, micro_batch
        self.every, self.archive = every, archive

    def __enter__(self) -> SyntheticRun:
        self._tmp = tempfile.TemporaryDirectory(prefix="lineage-archive-")
        self.work = Path(self._tmp.name)
        (self.work / "redis").mkdir()
        self.server = RedisServer(self.work / "redis")
        self.server.start()
        self.client = redis.Redis.from_url(self.server.url)
        url = self.server.url + (f"?archive={self.work / 'archive'}&archive_every={self.every}"
                                 if self.archive else "")
        self.store = open_store(url)
        self.store.open_run(self.run_id, self.plan, shards=self.shards,
                            micro_batch=self.micro_batch)
        self.base = int(self.client.info("memory")["used_memory"])
        self.epochs = {k: self.store.acquire_lease(self.run_id, k, DRIVER, ttl_s=3600)
                       for k in range(self.shards)}
        return self

    def __exit__(self, *_: Any) -> None:
        try:
            self.store.close()
        finally:
            self.server.stop()
            self._tmp.cleanup()

    def finish(self, sources: int) -> None:
        """``RunCompleted`` per shard, the shard marked done and its lease released; then
        what the archive thread has queued is written."""
        for k in range(self.shards):
            admitted = sum(1 for i in range(sources) if (i // self.micro_batch) % self.shards == k)
            self.store.append(self.run_id, k, self.epochs[k],
                              [RunCompleted(admitted, ts=time.time())], driver=DRIVER)
            self.store.mark_shard_done(self.run_id, k)
            self.store.release_lease(self.run_id, k, DRIVER, self.epochs[k])
        if self.archive:
            self.store.wait_archived(600)

    def archived_bytes(self) -> int:
        return sum(p.stat().st_size for p in (self.work / "archive").rglob("*.facts")) \
            if self.archive else 0

    def used_growth(self) -> int:
        return int(self.client.info("memory")["used_memory"]) - self.base


class RegionRun:
    """The region path, one micro-batch at a time a step further (:meth:`advance`), so that
    several batches are in flight at once, as they are in a driver."""

    STEPS = 6

    def __init__(self, store: Any, run_id: str, pages: int, regions: int) -> None:
        self.store, self.run_id, self.pages, self.regions = store, run_id, pages, regions

    def advance(self, shard: int, epoch: int, part: list[int], step: int) -> int:
        """Write step ``step`` of the batch ``part``; the pages it puts in flight (> 0) or
        takes out of flight (< 0)."""
        store, run_id, now = self.store, self.run_id, time.time

        def append(facts: list[Any]) -> None:
            store.append(run_id, shard, epoch, facts, driver=DRIVER)

        def commit(facts: list[Any]) -> None:
            store.commit(run_id, facts)

        srcs = [(i,) for i in part]
        pages = [(i, o) for i in part for o in range(self.pages)]
        regions = [(i, o, r) for i, o in pages for r in range(self.regions)]
        if step == 0:
            append([f for i in part for f in (SourceAdmitted(i, (f"doc{i}.pdf",), ts=now()),
                                               GrainDispatched("render", (i,), 0, ts=now()))])
        elif step == 1:
            commit([GrainCommitted("render", s, 0, REPORT_PRESENT,
                                   ([f"p{o}" for o in range(self.pages)],), ts=now())
                    for s in srcs])
            append([ExpansionClosed("root/0", s, EXPANSION_SUCCEEDED, self.pages, ts=now())
                    for s in srcs] + [GrainDispatched("layout", p, 0, ts=now()) for p in pages])
            return len(pages)
        elif step == 2:
            commit([GrainCommitted("layout", p, 0, REPORT_PRESENT,
                                   ([f"g{r}" for r in range(self.regions)],), ts=now())
                    for p in pages])
            append([ExpansionClosed("root/0/0", p, EXPANSION_SUCCEEDED, self.regions, ts=now())
                    for p in pages] + [GrainDispatched("rec", g, 0, ts=now()) for g in regions])
        elif step == 3:
            commit([GrainCommitted("rec", g, 0, REPORT_PRESENT, (f"t{g[2]}",), ts=now())
                    for g in regions])
            append([GrainDispatched("page", p, 0, ts=now()) for p in pages])
        elif step == 4:
            commit([GrainCommitted("page", p, 0, REPORT_PRESENT, ("md",), ts=now())
                    for p in pages])
            append([GrainDispatched("assemble", s, 0, ts=now()) for s in srcs])
        else:
            commit([GrainCommitted("assemble", s, 0, REPORT_PRESENT, ("doc",), ts=now())
                    for s in srcs])
            append([OutputEmitted(i, Outcome.PRESENT.value, ts=now()) for i in part])
            return -len(pages)
        return 0


def region_plan() -> Any:
    """The compiled plan of the region path's shape (calls render, layout, rec, page,
    assemble; domains root, root/0 for pages, root/0/0 for regions)."""
    from rayorch.core import functional as F
    from rayorch.core.compiler import compile_pipeline
    from rayorch.core.program import PipelineBase, RayModule

    class Same:
        def __call__(self, values: list[Any]) -> list[Any]:
            return values

    class RegionShaped(PipelineBase):
        def __init__(self) -> None:
            super().__init__()
            self.render, self.layout, self.rec = RayModule(Same), RayModule(Same), RayModule(Same)
            self.page, self.assemble = RayModule(Same), RayModule(Same)

        def forward(self, pdfs: Any) -> Any:
            regions = F.expand(self.layout(F.expand(self.render(pdfs))))
            return self.assemble(F.reduce(self.page(F.reduce(self.rec(regions)))))

    return compile_pipeline(RegionShaped())


def measure_regions(sources: int, *, shards: int, micro_batch: int, every: int,
                    archive: bool, window: int, pages: int, regions: int) -> dict[str, Any]:
    """The region path with ``window`` micro-batches in flight: Redis per page in flight."""
    with SyntheticRun("regions", region_plan(), shards=shards, micro_batch=micro_batch,
                      every=every, archive=archive) as run:
        fixed = shard_key_bytes(run.client, run.run_id, shards)
        script = RegionRun(run.store, run.run_id, pages, regions)
        batches = [list(range(f, min(f + micro_batch, sources)))
                   for f in range(0, sources, micro_batch)]
        flying: list[tuple[int, int]] = []  # (batch, next step)
        admitted = in_flight = 0
        best = (0, 0, 0)  # (pages in flight, shard key bytes, used_memory growth)
        started = time.monotonic()
        while admitted < len(batches) or flying:
            while admitted < len(batches) and len(flying) < window:
                flying.append((admitted, 0))
                admitted += 1
            moved = []
            for b, step in flying:
                in_flight += script.advance(b % shards, run.epochs[b % shards], batches[b],
                                            step)
                if step + 1 < RegionRun.STEPS:
                    moved.append((b, step + 1))
            flying = moved
            if in_flight >= best[0]:
                if archive:
                    run.store.wait_archived(60)
                best = max(best, (in_flight, shard_key_bytes(run.client, run.run_id, shards),
                                  run.used_growth()))
        run.finish(sources)
        elapsed = time.monotonic() - started
        after = shard_key_bytes(run.client, run.run_id, shards)
        archived = run.archived_bytes()
    facts = sources * (3 + pages * 5 + pages * regions * 2 + 2) + shards
    flying_pages, keys, growth = best
    grains = sources * (2 + pages * (2 + regions))
    return {"shape": "regions", "sources": sources, "pages": sources * pages,
            "regions": sources * pages * regions, "window": window, "archive": archive,
            "archive_every": every if archive else None, "facts_about": facts,
            "peak_pages_in_flight": flying_pages, "shard_keys_at_peak": keys,
            "fixed_shard_keys": fixed, "used_memory_growth_at_peak": growth,
            "shard_keys_per_page_in_flight": round(keys / max(1, flying_pages)),
            "growth_per_page_in_flight": round(growth / max(1, flying_pages)),
            "shard_keys_after": after,
            "archive_bytes_per_grain": round(archived / grains, 1),
            "elapsed_s": round(elapsed, 1)}


def region_report(rows: list[dict[str, Any]]) -> str:
    lines = ["sources  pages  window  archive  peak pages in flight  shard keys then  "
             "per page in flight  used_memory growth per page  shard keys after  "
             "archive/Grain"]
    for r in rows:
        lines.append(
            f"{r['sources']:>7}  {r['pages']:>5}  {r['window']:>6}  "
            f"{'yes' if r['archive'] else 'no':>7}  {r['peak_pages_in_flight']:>20}  "
            f"{r['shard_keys_at_peak'] / 1e6:12.2f} MB  "
            f"{r['shard_keys_per_page_in_flight']:>16} B  "
            f"{r['growth_per_page_in_flight']:>25} B  "
            f"{r['shard_keys_after'] / 1e3:13.1f} KB  {r['archive_bytes_per_grain']:>9} B")
    return "\n".join(lines)


def shard_key_bytes(client: redis.Redis, run_id: str, shards: int) -> int:
    """``MEMORY USAGE`` of every key of the run's shards (streams, Grain tables, counters)."""
    return sum(int(client.memory_usage(key, samples=0) or 0) for k in range(shards)
               for key in client.scan_iter(match=f"ro:{{{run_id}:{k}}}:*", count=100))


def measure(sources: int, *, shards: int, micro_batch: int, every: int, archive: bool
            ) -> dict[str, Any]:
    with SyntheticRun("synthetic", scripted_plan(), shards=shards, micro_batch=micro_batch,
                      every=every, archive=archive) as run:
        peak = peak_keys = 0
        started = time.monotonic()
        for b, first in enumerate(range(0, sources, micro_batch)):
            part = list(range(first, min(first + micro_batch, sources)))
            write_batch(run.store, run.run_id, b % shards, run.epochs[b % shards], part)
            peak = max(peak, run.used_growth())
            peak_keys = max(peak_keys, shard_key_bytes(run.client, run.run_id, shards))
        run.finish(sources)
        elapsed = time.monotonic() - started
        run_keys = sum(int(run.client.memory_usage(key, samples=0) or 0)
                       for key in run.client.scan_iter(match=f"ro:{{{run.run_id}*", count=1000))
        archived = run.archived_bytes()
    grains = sources * GRAINS_PER_SOURCE
    return {"sources": sources, "children": sources * CHILDREN, "shards": shards,
            "archive": archive, "archive_every": every if archive else None,
            "peak_growth_bytes": peak, "peak_shard_key_bytes": peak_keys,
            "run_key_bytes": run_keys,
            "archive_bytes": archived, "archive_bytes_per_grain": round(archived / grains, 1),
            "elapsed_s": round(elapsed, 1)}


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["sources  archive  peak growth  peak shard keys  keys after  archive/Grain  "
             "peak vs first  shard keys vs first  elapsed"]
    first: dict[bool, tuple[int, int]] = {}
    for r in rows:
        base, keys = first.setdefault(r["archive"], (max(1, r["peak_growth_bytes"]),
                                                     max(1, r["peak_shard_key_bytes"])))
        lines.append(
            f"{r['sources']:>7}  {'yes' if r['archive'] else 'no':>7}  "
            f"{r['peak_growth_bytes'] / 1e6:8.2f} MB  "
            f"{r['peak_shard_key_bytes'] / 1e6:12.2f} MB  "
            f"{r['run_key_bytes'] / 1e6:7.2f} MB  {r['archive_bytes_per_grain']:9.1f} B  "
            f"{r['peak_growth_bytes'] / base:10.2f}x  "
            f"{r['peak_shard_key_bytes'] / keys:16.2f}x  {r['elapsed_s']:6.1f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=50, help="sources per micro-batch")
    parser.add_argument("--every", type=int, default=20_000,
                        help="archive_every: facts a shard's driver appends between archives")
    parser.add_argument("--no-baseline", action="store_true",
                        help="only with archive= (no run without it)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--shape", choices=("pages", "regions"), default="pages",
                        help="pages: 10 children per source; regions: the region path")
    parser.add_argument("--window", type=int, default=8,
                        help="--shape regions: micro-batches in flight at once")
    parser.add_argument("--pages", type=int, default=10, help="--shape regions: per source")
    parser.add_argument("--regions", type=int, default=8, help="--shape regions: per page")
    args = parser.parse_args(argv)
    rows = []
    if args.shape == "regions":
        for archive in ([True] if args.no_baseline else [False, True]):
            for n in args.sources:
                rows.append(measure_regions(
                    n, shards=args.shards, micro_batch=args.micro_batch, every=args.every,
                    archive=archive, window=args.window, pages=args.pages,
                    regions=args.regions))
        print(json.dumps(rows) if args.json else region_report(rows))
        return 0
    for archive in ([True] if args.no_baseline else [False, True]):
        for n in args.sources:
            rows.append(measure(n, shards=args.shards, micro_batch=args.micro_batch,
                                every=args.every, archive=archive))
    print(json.dumps(rows) if args.json else report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
