"""Server render time of each web view page (``rayorch ui``) on a large synthetic run.

A run of ``--sources`` documents with ``--children`` pages each (defaults 10,000 and 20:
200,000 children) is written into a memory store through its ordinary API (admissions,
dispatches, commits through the commit gate, expansions, outputs; 1% of the pages fail with
one of five causes, 1% are retried once), spread over ``--shards`` shards. Then every page is
requested through the real app (Starlette's TestClient: routing, the run view, templates);
the first request folds the run once (reported apart), the later ones extend it. Last, more
facts are appended and the live run page is timed again (the incremental ``extend``).

    python -m bench.ui_render [--sources 10000] [--children 20] [--shards 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from starlette.testclient import TestClient

from rayorch.core.facts import (
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    ExpansionClosed,
    GrainCommitted,
    GrainDispatched,
    GrainRetried,
    OutputEmitted,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.store import open_store
from rayorch.store.base import LineageStore
from rayorch.store.scripted_run import scripted_plan
from rayorch.ui.app import build_app

CAUSES = [f"OcrError: page unreadable (kind {k})" for k in range(5)]


def write_run(store: LineageStore, run_id: str, *, sources: int, children: int, shards: int,
              seed: int = 0, first: int = 0, micro_batch: int = 16,
              epochs: dict[int, int] | None = None, complete: bool = True) -> dict[int, int]:
    """Write sources ``first .. first+sources-1``; returns the shard epochs."""
    rng = random.Random(seed)
    if epochs is None:
        store.open_run(run_id, scripted_plan(), shards=shards, micro_batch=micro_batch)
        epochs = {k: store.acquire_lease(run_id, k, "bench", ttl_s=3600) for k in range(shards)}
    info = store.run_info(run_id)
    t = time.time()
    for index in range(first, first + sources):
        shard = info.shard_of(index)
        epoch = epochs[shard]
        src = (index,)
        t += 0.001
        store.append(run_id, shard, epoch, [SourceAdmitted(index, (f"doc{index}.pdf",), ts=t),
                                            GrainDispatched("render", src, 0, ts=t)],
                     driver="bench")
        page_values = [f"p{o}" for o in range(children)]
        store.commit(run_id, [GrainCommitted("render", src, 0, REPORT_PRESENT, (page_values,),
                                             ts=t + 0.01)])
        pages = [(index, o) for o in range(children)]
        facts: list[Any] = [ExpansionClosed("root/0", src, "succeeded", children, ts=t + 0.01)]
        facts += [GrainDispatched("ocr", p, 0, ts=t + 0.02) for p in pages]
        retried = [p for p in pages if rng.random() < 0.01]
        facts += [GrainRetried("ocr", p, 1, "ActorDiedError: worker crashed", ts=t + 0.03)
                  for p in retried]
        facts += [GrainDispatched("ocr", p, 1, ts=t + 0.03) for p in retried]
        store.append(run_id, shard, epoch, facts, driver="bench")
        reports = []
        failed = False
        for p in pages:
            gen = 1 if p in retried else 0
            if rng.random() < 0.01:
                failed = True
                reports.append(GrainCommitted("ocr", p, gen, REPORT_RECORD_FAILURE,
                                              cause=rng.choice(CAUSES), ts=t + 0.05))
            else:
                reports.append(GrainCommitted("ocr", p, gen, REPORT_PRESENT, (None,),
                                              ts=t + 0.05))
        store.commit(run_id, reports)
        if failed:
            store.append(run_id, shard, epoch, [OutputEmitted(index, "suppressed",
                                                              ts=t + 0.06)], driver="bench")
            continue
        store.append(run_id, shard, epoch, [GrainDispatched("assemble", src, 0, ts=t + 0.06)],
                     driver="bench")
        store.commit(run_id, [GrainCommitted("assemble", src, 0, REPORT_PRESENT, (None,),
                                             ts=t + 0.07)])
        store.append(run_id, shard, epoch, [OutputEmitted(index, "present", ts=t + 0.08)],
                     driver="bench")
    if complete:
        for k in range(shards):
            admitted = sum(1 for i in range(first + sources) if info.shard_of(i) == k)
            store.append(run_id, k, epochs[k], [RunCompleted(admitted, ts=t + 0.1)],
                         driver="bench")
    return epochs


def timed(client: TestClient, url: str, repeat: int, pause_s: float) -> tuple[float, int]:
    """Median seconds of ``repeat`` requests (each after ``pause_s``, so the live view
    reads the store again: a poll) and the status code."""
    times = []
    code = 0
    for _ in range(repeat):
        time.sleep(pause_s)
        start = time.perf_counter()
        response = client.get(url)
        times.append(time.perf_counter() - start)
        code = response.status_code
    return statistics.median(times), code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=10_000)
    parser.add_argument("--children", type=int, default=20)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    store = open_store("memory://ui-bench")
    run_id = "big"
    # Facts written while the run is live (no RunCompleted): the page keeps polling.
    start = time.perf_counter()
    epochs = write_run(store, run_id, sources=args.sources, children=args.children,
                       shards=args.shards, complete=False)
    facts = sum(len(list(store.iter_facts(run_id, k, payloads=False)))
                for k in range(args.shards))
    print(f"wrote {args.sources:,} sources, {args.sources * args.children:,} children, "
          f"{facts:,} facts in {args.shards} shards: {time.perf_counter() - start:.1f} s")
    client = TestClient(build_app(store))
    start = time.perf_counter()
    page = client.get(f"/runs/{run_id}").text
    answered = time.perf_counter() - start
    while 'id="reading"' in page:  # the run is read on a thread; the page polls, as live.js
        time.sleep(2.0)
        page = client.get(f"/runs/{run_id}").text
    print(f"first request: answered in {answered:.2f} s; the whole run read and folded (on a "
          f"thread, pages showing how far) in {time.perf_counter() - start:.2f} s")
    failing = client.get(f"/runs/{run_id}").text.split(f'href="/runs/{run_id}/failures/')[1]
    key = failing.split('"')[0]
    pages = [
        ("runs list", "/"),
        ("run (live poll)", f"/runs/{run_id}"),
        ("sources, page 1", f"/runs/{run_id}/sources"),
        ("sources, page 100", f"/runs/{run_id}/sources?page=100"),
        ("failed sources, page 1", f"/runs/{run_id}/sources?only=failed"),
        ("failures of one cause, page 1", f"/runs/{run_id}/failures/{key}"),
        ("source (20 pages)", f"/runs/{run_id}/sources/{args.sources // 2}"),
        ("page of a source", f"/runs/{run_id}/sources/{args.sources // 2}.7"),
        ("timeline (again, no new facts)", f"/runs/{run_id}/timeline"),
    ]
    print(f"\n| page | median of {args.repeat} (s) | status |\n| --- | --- | --- |")
    time.sleep(0.55)
    start = time.perf_counter()
    code = client.get(f"/runs/{run_id}/timeline").status_code
    print(f"| timeline, first (computed from the view) | {time.perf_counter() - start:.3f} "
          f"| {code} |")
    for name, url in pages:
        seconds, code = timed(client, url, args.repeat, 0.55)
        print(f"| {name} | {seconds:.3f} | {code} |")
    # The live part: 100 more sources (about 4,300 facts), then one poll of the run page.
    write_run(store, run_id, sources=100, children=args.children, shards=args.shards,
              first=args.sources, epochs=epochs, complete=False, seed=1)
    time.sleep(0.55)
    start = time.perf_counter()
    client.get(f"/runs/{run_id}")
    print(f"| run page after 100 more sources (extend, not refold) | "
          f"{time.perf_counter() - start:.3f} | 200 |")
    start = time.perf_counter()
    client.get(f"/runs/{run_id}/timeline")
    print(f"| timeline after those (computed again from the tallies) | "
          f"{time.perf_counter() - start:.3f} | 200 |")
    start = time.perf_counter()
    first = client.get(f"/runs/{run_id}/audit")
    answered = time.perf_counter() - start
    page = first.text
    while 'id="audit-verdict">running' in page:
        time.sleep(1.0)
        page = client.get(f"/runs/{run_id}/audit").text
    verdict = page.split('id="audit-verdict">')[1].split("<")[0]
    print(f"\naudit on demand: the page answers in {answered:.3f} s (running on a thread); "
          f"verdict {verdict} after {time.perf_counter() - start:.1f} s (a kernel fold of "
          "every shard)")
    store.close()


if __name__ == "__main__":
    main()
