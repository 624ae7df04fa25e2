"""The Redis store's Grain table in buckets vs one hash per shard (issue 37): bytes per page in
flight, and the commit's server time.

One shard on a fresh ``redis-server`` of its own, through the real Redis store: ``--sources``
sources with their pages (and, ``regions``, their regions) dispatched and committed as a driver
and its workers write them (the writers of ``bench/lineage_archive.py``), none delivered, so
every Grain's entry is in the table. ``MEMORY USAGE`` of the Grain keys over the pages in
flight gives the table's bytes per page; ``INFO commandstats`` (evalsha) over the commits,
in batches of ``--batch`` reports, its server time per committed Grain. The baseline in the
same run is the same run with one Grain hash per shard (a run opened before buckets: its meta
without ``grain_table``).

    python bench/grain_table.py                     # regions and pages, 50 sources
    python bench/grain_table.py --sources 200 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import redis

from bench.lineage_archive import DRIVER, RegionRun, region_plan
from rayorch.core.facts import REPORT_PRESENT, ExpansionClosed, GrainCommitted, GrainDispatched
from rayorch.core.vocabulary import EXPANSION_SUCCEEDED
from rayorch.store.keys import GRAIN_TABLE_FIELD, ShardKeys, meta_key
from rayorch.store.registry import open_store
from rayorch.store.scripted_run import scripted_plan
from rayorch.testing import RedisServer

PAGES, REGIONS = 10, 8


def grain_bytes(shape: str, sources: int, *, one_hash: bool) -> tuple[float, set[str]]:
    """Bytes of the Grain table per page in flight, and the encodings of its hashes."""
    with tempfile.TemporaryDirectory(prefix="grain-table-") as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            client = redis.Redis.from_url(server.url)
            store = open_store(server.url)
            plan = region_plan() if shape == "regions" else scripted_plan()
            store.open_run("g", plan, shards=1, micro_batch=sources)
            if one_hash:
                client.hdel(meta_key("g"), GRAIN_TABLE_FIELD)
                store = open_store(server.url)
            epoch = store.acquire_lease("g", 0, DRIVER, ttl_s=600)
            run = RegionRun(store, "g", PAGES, REGIONS)
            steps = range(4) if shape == "regions" else range(2)  # children committed
            for step in steps:
                if shape == "regions":
                    run.advance(0, epoch, list(range(sources)), step)
                else:
                    _pages_step(store, epoch, sources, step)
            keys = list(client.scan_iter(match=ShardKeys("g", 0).grains + "*", count=1000))
            used = sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)
            encodings = {client.object("encoding", k).decode() for k in keys}
            store.close()
            return used / (sources * PAGES), encodings
        finally:
            server.stop()


def _pages_step(store: Any, epoch: int, sources: int, step: int) -> None:
    """The text path (render -> pages -> ocr): step 0 renders, step 1 reads every page."""
    srcs = [(i,) for i in range(sources)]
    if step == 0:
        store.append("g", 0, epoch, [GrainDispatched("render", s, 0) for s in srcs],
                     driver=DRIVER)
        store.commit("g", [GrainCommitted("render", s, 0, REPORT_PRESENT,
                                          ([f"p{o}" for o in range(PAGES)],)) for s in srcs])
        return
    pages = [(i, o) for i in range(sources) for o in range(PAGES)]
    store.append("g", 0, epoch, [ExpansionClosed("root/0", s, EXPANSION_SUCCEEDED, PAGES)
                                 for s in srcs] + [GrainDispatched("ocr", p, 0) for p in pages],
                 driver=DRIVER)
    store.commit("g", [GrainCommitted("ocr", p, 0, REPORT_PRESENT, ("t",)) for p in pages])


def commit_us(shape: str, grains: int, batch: int, *, one_hash: bool) -> float:
    """Server time (evalsha) per committed Grain, commits in batches of ``batch``."""
    with tempfile.TemporaryDirectory(prefix="grain-table-") as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            client = redis.Redis.from_url(server.url)
            store = open_store(server.url)
            if shape == "regions":
                store.open_run("c", region_plan(), shards=1, micro_batch=10**6)
                paths = [(i // (PAGES * REGIONS), (i // REGIONS) % PAGES, i % REGIONS)
                         for i in range(grains)]
                call = "rec"
            else:
                store.open_run("c", scripted_plan(), shards=1, micro_batch=10**6)
                paths = [(i // PAGES, i % PAGES) for i in range(grains)]
                call = "ocr"
            if one_hash:
                client.hdel(meta_key("c"), GRAIN_TABLE_FIELD)
                store = open_store(server.url)
            epoch = store.acquire_lease("c", 0, DRIVER, ttl_s=600)
            for at in range(0, grains, 1000):
                store.append("c", 0, epoch, [GrainDispatched(call, p, 0)
                                             for p in paths[at:at + 1000]], driver=DRIVER)
            client.config_resetstat()
            for at in range(0, grains, batch):
                store.commit("c", [GrainCommitted(call, p, 0, REPORT_PRESENT, ("t",))
                                   for p in paths[at:at + batch]])
            usec = float(client.info("commandstats")["cmdstat_evalsha"]["usec"])
            store.close()
            return usec / grains
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=50)
    parser.add_argument("--grains", type=int, default=20_480, help="committed, per run")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="runs per commit figure (median)")
    args = parser.parse_args(argv)
    print("shape    table     bytes/page in flight  encodings            "
          "commit server us/Grain (median)  vs one hash")
    for shape in ("regions", "pages"):
        rows = {}
        for one_hash in (True, False):
            per_page, encodings = grain_bytes(shape, args.sources, one_hash=one_hash)
            runs = [commit_us(shape, args.grains, args.batch, one_hash=one_hash)
                    for _ in range(args.repeat)]
            rows[one_hash] = (per_page, encodings, statistics.median(runs), runs)
        for one_hash in (True, False):
            per_page, encodings, us, runs = rows[one_hash]
            ratio = (f"{per_page / rows[True][0]:.2f}x bytes, {us / rows[True][2]:.2f}x time"
                     if not one_hash else "")
            print(f"{shape:8s} {'one hash' if one_hash else 'buckets':9s} {per_page:12.0f} B"
                  f"        {','.join(sorted(encodings)):20s} {us:6.2f} "
                  f"({', '.join(f'{r:.2f}' for r in runs)})  {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
