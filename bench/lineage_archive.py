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


def shard_key_bytes(client: redis.Redis, run_id: str, shards: int) -> int:
    """``MEMORY USAGE`` of every key of the run's shards (streams, Grain tables, counters)."""
    return sum(int(client.memory_usage(key, samples=0) or 0) for k in range(shards)
               for key in client.scan_iter(match=f"ro:{{{run_id}:{k}}}:*", count=100))


def measure(sources: int, *, shards: int, micro_batch: int, every: int, archive: bool
            ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lineage-archive-") as tmp:
        work = Path(tmp)
        (work / "redis").mkdir()
        server = RedisServer(work / "redis")
        server.start()
        try:
            client = redis.Redis.from_url(server.url)
            url = server.url + (f"?archive={work / 'archive'}&archive_every={every}"
                                if archive else "")
            store = open_store(url)
            run_id = "synthetic"
            store.open_run(run_id, scripted_plan(), shards=shards, micro_batch=micro_batch)
            base = int(client.info("memory")["used_memory"])
            epochs = {k: store.acquire_lease(run_id, k, DRIVER, ttl_s=3600)
                      for k in range(shards)}
            peak = peak_keys = 0
            started = time.monotonic()
            for b, first in enumerate(range(0, sources, micro_batch)):
                part = list(range(first, min(first + micro_batch, sources)))
                write_batch(store, run_id, b % shards, epochs[b % shards], part)
                peak = max(peak, int(client.info("memory")["used_memory"]) - base)
                peak_keys = max(peak_keys, shard_key_bytes(client, run_id, shards))
            for k in range(shards):
                admitted = sum(1 for i in range(sources) if (i // micro_batch) % shards == k)
                store.append(run_id, k, epochs[k], [RunCompleted(admitted, ts=time.time())],
                             driver=DRIVER)
                store.mark_shard_done(run_id, k)
                store.release_lease(run_id, k, DRIVER, epochs[k])
            store.wait_archived(600)
            elapsed = time.monotonic() - started
            run_keys = sum(int(client.memory_usage(key, samples=0) or 0)
                           for key in client.scan_iter(match=f"ro:{{{run_id}*", count=1000))
            archived = sum(p.stat().st_size for p in (work / "archive").rglob("*.facts")) \
                if archive else 0
            store.close()
        finally:
            server.stop()
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
    args = parser.parse_args(argv)
    rows = []
    for archive in ([True] if args.no_baseline else [False, True]):
        for n in args.sources:
            rows.append(measure(n, shards=args.shards, micro_batch=args.micro_batch,
                                every=args.every, archive=archive))
    print(json.dumps(rows) if args.json else report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
