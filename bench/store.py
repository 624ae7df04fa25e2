"""Lineage store throughput: committed Grains/s per shard and rebuild facts/s.

    python bench/store.py                      # a private redis-server, then the memory store
    python bench/store.py --url redis://host:6379/0 --grains 50000
    python bench/store.py --results bench/RESULTS.md   # append the table there
    python bench/store.py --scaling --results bench/RESULTS.md   # shards x servers (below)

One shard. Commit: N child Grains are dispatched first (untimed), then their reports
are committed in batches of 1, 16 and 64 (one store round trip per batch) by one
client, and (Redis only) in batches of 16 and 64 by ``--clients`` client processes at
once, each committing its own slice, as several actors commit to one shard in a run
(rate = all Grains / from the first start to the last finish). Each commit figure is
the median of ``--repeat`` runs. Rebuild: every fact of the shard is read back in
order and decoded, then also folded through the kernel. Targets: >= 30k Grains/s per
shard with batching, rebuild >= 1M facts/min.

``--scaling``: commit Grains/s of one run with 1, 3 and 6 shards, on one private
redis-server and on a private 3-master + 3-replica Redis Cluster (``redis+cluster://``,
with and without the replica ``WAIT`` after every commit), ``--clients`` processes
committing batches of 64 at once; the masters' CPU time per committed Grain (``INFO
cpu``), their memory per fact (``INFO memory``), and the rebuild rate of each shard.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rayorch.core.facts import (
    REPORT_PRESENT,
    ExpansionClosed,
    GrainCommitted,
    GrainDispatched,
    OutputEmitted,
    SourceAdmitted,
)
from rayorch.core.plan import Plan
from rayorch.store import LineageStore, open_store
from rayorch.store.base import shard_of
from rayorch.store.scripted_run import scripted_plan
from rayorch.testing import RedisClusterNodes, RedisServer, redis_server_path

PAGES_PER_SOURCE = 100


@contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server on a free port in a temp dir, no persistence; stopped by PID."""
    if redis_server_path() is None:
        raise SystemExit("redis-server is not installed; pass --url")
    with tempfile.TemporaryDirectory() as workdir, RedisServer(Path(workdir)) as server:
        yield server.url


def paths(grains: int) -> list[tuple[int, int]]:
    return [(i // PAGES_PER_SOURCE, i % PAGES_PER_SOURCE) for i in range(grains)]


def reports_of(todo: list[tuple[int, int]]) -> list[GrainCommitted]:
    return [GrainCommitted("ocr", p, 0, REPORT_PRESENT, (f"text of page {p}",), ts=time.time())
            for p in todo]


def commit_all(store: LineageStore, run: str, reports: list[GrainCommitted], batch: int) -> None:
    for start in range(0, len(reports), batch):
        verdicts = store.commit(run, reports[start:start + batch])
        assert all(v.accepted for v in verdicts)


def commit_client(url: str, run: str, todo: list[tuple[int, int]], batch: int,
                  ready: Any, done: Any) -> None:
    """One client process: commit its slice once every client is ready; report its clock."""
    store = open_store(url)
    store.run_info(run)  # connect and load the run before the clock starts
    reports = reports_of(todo)
    ready.wait()
    started = time.monotonic()
    commit_all(store, run, reports, batch)
    done.put((started, time.monotonic()))
    store.close()


def concurrent_commits(url: str, run: str, slices: list[list[tuple[int, int]]],
                       batch: int) -> float:
    """One client process per slice, all committing at once; seconds from first start to
    last finish."""
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Barrier(len(slices)), ctx.Queue()
    procs = [ctx.Process(target=commit_client, args=(url, run, part, batch, ready, done))
             for part in slices]
    for proc in procs:
        proc.start()
    clocks = [done.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0, f"a commit client failed (exit code {proc.exitcode})"
    return max(end for _, end in clocks) - min(start for start, _ in clocks)


def bench_commits(store: LineageStore, grains: int, batch: int, clients: int = 1) -> float:
    """Committed Grains per second on one shard with ``batch`` reports per commit call."""
    run = f"bench-commit-{batch}-{time.time_ns()}"
    store.open_run(run, scripted_plan(), shards=1, micro_batch=1)
    epoch = store.acquire_lease(run, 0, "bench", ttl_s=3600)
    todo = paths(grains)
    for start in range(0, len(todo), 1000):
        chunk = todo[start:start + 1000]
        store.append(run, 0, epoch, [GrainDispatched("ocr", p, 0) for p in chunk], driver="bench")
    if clients == 1:
        reports = reports_of(todo)
        started = time.perf_counter()
        commit_all(store, run, reports, batch)
        elapsed = time.perf_counter() - started
    else:
        share = -(-grains // clients)
        elapsed = concurrent_commits(store.url, run, [todo[k * share:(k + 1) * share]
                                                      for k in range(clients)], batch)
    store.delete_run(run)
    return grains / elapsed


def write_sources(store: LineageStore, run: str, epoch: int, sources: int) -> None:
    """Whole source items as a driver writes them: render, 100 OCR pages, assemble."""
    for index in range(sources):
        src = (index,)
        store.append(run, 0, epoch, [SourceAdmitted(index, (f"doc{index}",)),
                                     GrainDispatched("render", src, 0)], driver="bench")
        pages = [f"page {o}" for o in range(PAGES_PER_SOURCE)]
        store.commit(run, [GrainCommitted("render", src, 0, REPORT_PRESENT, (pages,))])
        children = [(index, o) for o in range(PAGES_PER_SOURCE)]
        store.append(run, 0, epoch,
                     [ExpansionClosed("root/0", src, "succeeded", PAGES_PER_SOURCE)]
                     + [GrainDispatched("ocr", p, 0) for p in children], driver="bench")
        store.commit(run, [GrainCommitted("ocr", p, 0, REPORT_PRESENT, (f"text {p}",))
                           for p in children])
        store.append(run, 0, epoch, [GrainDispatched("assemble", src, 0)], driver="bench")
        store.commit(run, [GrainCommitted("assemble", src, 0, REPORT_PRESENT, ("doc",))])
        store.append(run, 0, epoch, [OutputEmitted(index, "present")], driver="bench")


def bench_rebuild(store: LineageStore, facts: int) -> tuple[int, float, float | None]:
    """(facts, read+decode facts/s, read+decode+kernel-fold facts/s) for one shard."""
    run = f"bench-rebuild-{time.time_ns()}"
    store.open_run(run, scripted_plan(), shards=1, micro_batch=1)
    epoch = store.acquire_lease(run, 0, "bench", ttl_s=3600)
    write_sources(store, run, epoch, max(1, facts // (2 * PAGES_PER_SOURCE + 7)))
    started = time.perf_counter()
    total = sum(1 for _ in store.iter_facts(run, 0))
    read_rate = total / (time.perf_counter() - started)
    fold_rate = None
    try:
        from rayorch.core.state import Kernel
    except ImportError:
        Kernel = None  # type: ignore[assignment,misc]
    if Kernel is not None:
        started = time.perf_counter()
        kernel = Kernel(Plan.from_description(store.run_info(run).plan))
        for stored in store.iter_facts(run, 0):
            kernel.apply(stored.fact)
        assert kernel.finished
        fold_rate = total / (time.perf_counter() - started)
    store.delete_run(run)
    return total, read_rate, fold_rate


# -- scaling: shards x servers ------------------------------------------------------------------
def server_stats(ports: list[int]) -> tuple[list[float], int]:
    """(CPU seconds of each redis-server on ``ports``, their used memory in bytes, summed)."""
    import redis

    cpu, memory = [], 0
    for port in ports:
        client = redis.Redis(port=port)
        info = client.info()
        cpu.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
        memory += int(info["used_memory"])
        client.close()
    return cpu, memory


def shard_homes(url: str, run: str, shards: int, ports: list[int]) -> str:
    """How many of the run's shards each master serves, e.g. ``"2/2/2"``."""
    if len(ports) == 1:
        return str(shards)
    from redis.cluster import RedisCluster

    from rayorch.store.keys import ShardKeys

    client = RedisCluster(host="127.0.0.1", port=ports[0])
    served = [client.get_node_from_key(ShardKeys(run, k).lease).port for k in range(shards)]
    client.close()
    return "/".join(str(n) for n in sorted((served.count(p) for p in ports), reverse=True))


def bench_sharded_commits(url: str, ports: list[int], shards: int, grains: int, clients: int,
                          batch: int = 64) -> dict[str, float]:
    """Grains/s of ``clients`` committers over one run of ``shards`` shards, and server cost."""
    store = open_store(url)
    run = f"bench-scale-{shards}-{time.time_ns()}"
    store.open_run(run, scripted_plan(), shards=shards, micro_batch=1)
    epochs = {k: store.acquire_lease(run, k, "bench", ttl_s=3600) for k in range(shards)}
    todo = paths(grains)
    for k in range(shards):
        mine = [p for p in todo if shard_of(p[0], 1, shards) == k]
        for start in range(0, len(mine), 1000):
            store.append(run, k, epochs[k],
                         [GrainDispatched("ocr", p, 0) for p in mine[start:start + 1000]])
    homes = shard_homes(url, run, shards, ports)
    cpu_before, _ = server_stats(ports)
    # client k commits sources k, k + clients, ...
    elapsed = concurrent_commits(url, run, [[p for p in todo if p[0] % clients == k]
                                            for k in range(clients)], batch)
    cpu_after, _ = server_stats(ports)
    store.delete_run(run)
    store.close()
    spent = [after - before for before, after in zip(cpu_before, cpu_after)]
    return {"per_s": grains / elapsed, "server_us": sum(spent) * 1e6 / grains,
            "ceiling": grains / max(spent), "homes": homes}


def bench_memory_and_rebuild(url: str, ports: list[int], shards: int, sources: int,
                             text_bytes: int) -> dict[str, float]:
    """Server bytes per fact (pages carrying ``text_bytes`` of text) and per-shard rebuild."""
    store = open_store(url)
    run = f"bench-mem-{time.time_ns()}"
    store.open_run(run, scripted_plan(), shards=shards, micro_batch=1)
    epochs = {k: store.acquire_lease(run, k, "bench", ttl_s=3600) for k in range(shards)}
    _, memory_before = server_stats(ports)
    text = "x" * text_bytes
    for index in range(sources):
        k = shard_of(index, 1, shards)
        src = (index,)
        children = [(index, o) for o in range(PAGES_PER_SOURCE)]
        store.append(run, k, epochs[k], [SourceAdmitted(index, (f"doc{index}",)),
                                         GrainDispatched("render", src, 0)])
        store.commit(run, [GrainCommitted("render", src, 0, REPORT_PRESENT,
                                          ([f"p{o}" for o in range(PAGES_PER_SOURCE)],))])
        store.append(run, k, epochs[k],
                     [ExpansionClosed("root/0", src, "succeeded", PAGES_PER_SOURCE)]
                     + [GrainDispatched("ocr", p, 0) for p in children])
        for start in range(0, PAGES_PER_SOURCE, 64):
            store.commit(run, [GrainCommitted("ocr", p, 0, REPORT_PRESENT, (text,))
                               for p in children[start:start + 64]])
        store.append(run, k, epochs[k], [GrainDispatched("assemble", src, 0)])
        store.commit(run, [GrainCommitted("assemble", src, 0, REPORT_PRESENT, ("doc",))])
        store.append(run, k, epochs[k], [OutputEmitted(index, "present")])
    _, memory_after = server_stats(ports)
    from rayorch.core.state import Kernel

    plan = Plan.from_description(store.run_info(run).plan)
    facts, read_s, fold_s = 0, 0.0, 0.0
    for k in range(shards):  # a new holder's rebuild: read the shard, fold it into a kernel
        started = time.perf_counter()
        stored = list(store.iter_facts(run, k))
        read_s += time.perf_counter() - started
        started = time.perf_counter()
        kernel = Kernel(plan)
        for item in stored:
            kernel.apply(item.fact)
        assert kernel.finished
        fold_s += time.perf_counter() - started
        facts += len(stored)
    store.delete_run(run)
    store.close()
    return {"facts": facts, "bytes_per_fact": (memory_after - memory_before) / facts,
            "rebuild_per_min": facts / read_s * 60,
            "fold_per_min": facts / (read_s + fold_s) * 60}


@contextmanager
def topologies(workdir: Path) -> Iterator[list[tuple[str, str, list[int]]]]:
    """(name, URL, master ports): one redis-server; a 3+3 cluster with and without WAIT."""
    (workdir / "single").mkdir()
    with RedisServer(workdir / "single") as single, \
            RedisClusterNodes(workdir / "cluster") as cluster:
        masters = cluster.master_ports()
        yield [
            ("1 server", single.url, [single.port]),
            ("cluster 3+3", cluster.url, masters),
            ("cluster 3+3, no WAIT", f"{cluster.url}?wait_replicas=0", masters),
        ]


def scaling(args: argparse.Namespace) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as workdir, topologies(Path(workdir)) as tops:
        for name, url, ports in tops:
            for shards in (1, 3, 6):
                runs = [bench_sharded_commits(url, ports, shards, args.grains, args.clients)
                        for _ in range(args.repeat)]
                best = sorted(runs, key=lambda r: r["per_s"])[len(runs) // 2]
                rows.append({"store": name, "shards": shards, "clients": args.clients,
                             "per_s": round(best["per_s"]),
                             "server_us": round(best["server_us"], 1),
                             "ceiling": round(best["ceiling"], -3), "homes": best["homes"]})
                print(f"{name}, {shards} shards ({best['homes']}), {args.clients} clients: "
                      f"{best['per_s']:,.0f} Grains/s, masters' CPU {best['server_us']:.1f} "
                      f"µs/Grain, ceiling {best['ceiling']:,.0f} Grains/s", flush=True)
            if "no WAIT" in name:
                continue
            for text_bytes in (16, 2048):
                got = bench_memory_and_rebuild(url, ports, 6, args.facts // 207, text_bytes)
                rows.append({"store": name, "shards": 6, "text_bytes": text_bytes,
                             "facts": got["facts"],
                             "bytes_per_fact": round(got["bytes_per_fact"]),
                             "rebuild_per_min": round(got["rebuild_per_min"]),
                             "fold_per_min": round(got["fold_per_min"])})
                print(f"{name}, 6 shards, page text {text_bytes} B: "
                      f"{got['bytes_per_fact']:,.0f} B/fact in Redis, rebuild "
                      f"{got['rebuild_per_min'] / 1e6:.2f}M facts/min per shard (read + "
                      f"decode), {got['fold_per_min'] / 1e6:.2f}M with the kernel fold",
                      flush=True)
    return rows


def write_scaling(path: Path, rows: list[dict[str, object]], command: str) -> None:
    lines = [
        "",
        f"## Lineage store scaling (`bench/store.py --scaling`), {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `python {command}` on {platform.node()} ({os.cpu_count()} CPUs, shared; "
        f"load average {os.getloadavg()[0]:.1f} at the end). Servers are private, without "
        "persistence, on this machine; the cluster is 3 masters + 3 replicas.",
        "",
        "| store | shards | shards per master | clients | commit Grains/s (batch 64) | "
        "masters' CPU µs/Grain | ceiling Grains/s (busiest master at one core) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [f"| {r['store']} | {r['shards']} | {r['homes']} | {r['clients']} | "
              f"{r['per_s']:,} | {r['server_us']} | {r['ceiling']:,.0f} |"
              for r in rows if "per_s" in r]
    lines += ["", "| store | shards | page text | facts | Redis bytes/fact | rebuild facts/min "
              "per shard: read + decode | + kernel fold |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['store']} | {r['shards']} | {r['text_bytes']} B | {r['facts']:,} | "
              f"{r['bytes_per_fact']:,} | {r['rebuild_per_min']:,} | {r['fold_per_min']:,} |"
              for r in rows if "bytes_per_fact" in r]
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a Redis URL (default: start a private redis-server)")
    parser.add_argument("--grains", type=int, default=20_000)
    parser.add_argument("--facts", type=int, default=200_000)
    parser.add_argument("--clients", type=int, default=4,
                        help="client processes committing to one shard at once (Redis; 1: skip)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per commit figure (the median is reported)")
    parser.add_argument("--results", type=Path, help="append the table to this markdown file")
    parser.add_argument("--scaling", action="store_true",
                        help="shards x servers instead (one server, a 3+3 Redis Cluster)")
    args = parser.parse_args()
    if args.scaling:
        scale_rows = scaling(args)
        print(json.dumps(scale_rows))
        if args.results:
            write_scaling(args.results, scale_rows, " ".join(sys.argv))
        return

    rows: list[dict[str, object]] = []

    def measure(name: str, url: str) -> None:
        store = open_store(url)
        cases = [(batch, 1) for batch in (1, 16, 64)]
        if name == "redis" and args.clients > 1:
            cases += [(batch, args.clients) for batch in (16, 64)]
        for batch, clients in cases:
            grains = args.grains if batch > 1 else max(1000, args.grains // 4)
            runs = [bench_commits(store, grains, batch, clients) for _ in range(args.repeat)]
            rate = statistics.median(runs)
            label = f"commit batch {batch}, {clients} client" + ("s" if clients > 1 else "")
            rows.append({"store": name, "metric": label, "grains": grains, "per_s": round(rate)})
            print(f"{name}: {label}: {rate:,.0f} Grains/s (median of "
                  f"{', '.join(f'{r:,.0f}' for r in runs)})", flush=True)
        total, read_rate, fold_rate = bench_rebuild(store, args.facts)
        rates: list[tuple[str, float | None]] = [
            ("rebuild: read + decode", read_rate), ("rebuild: read + decode + fold", fold_rate)]
        for metric, per_s in rates:
            if per_s is None:
                continue
            rows.append({"store": name, "metric": f"{metric} ({total} facts)",
                         "per_s": round(per_s), "per_min": round(per_s * 60)})
            print(f"{name}: {metric}: {per_s:,.0f} facts/s ({per_s * 60 / 1e6:.2f}M facts/min)",
                  flush=True)
        store.close()

    if args.url:
        measure("redis", args.url)
    else:
        with private_redis() as url:
            measure("redis", url)
    measure("memory", "memory://")
    print(json.dumps(rows))
    if args.results:
        write_results(args.results, rows, " ".join(sys.argv), args.repeat)


def write_results(path: Path, rows: list[dict[str, object]], command: str, repeat: int) -> None:
    lines = [
        "",
        f"## Lineage store (`bench/store.py`), {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `python {command}` on {platform.node()} ({os.cpu_count()} CPUs, shared), "
        f"one shard, local redis-server 7 without persistence, load average "
        f"{os.getloadavg()[0]:.1f} at the end; commit figures are medians of "
        f"{repeat} runs; \"N clients\" = N client processes committing to the shard at once.",
        "",
        "| store | metric | per second | per minute |",
        "| --- | --- | ---: | ---: |",
    ]
    for row in rows:
        per_min = row.get("per_min")
        lines.append(f"| {row['store']} | {row['metric']} | {row['per_s']:,} | "
                     f"{'' if per_min is None else f'{per_min:,}'} |")
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
