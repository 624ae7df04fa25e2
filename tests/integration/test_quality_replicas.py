"""Two replica drivers of one run with dedup stages: the dedup index is the store's, so
each duplicate group keeps exactly one copy whichever driver's shard and whichever
actor claimed first, and every dropped copy names a delivered one."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from rayorch.inspect.audit import audit_run
from rayorch.pipelines.quality import TextQuality, new_scope
from rayorch.replicas import create_run, join_run
from rayorch.runtime.sinks import read_outputs
from rayorch.store import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600),
              # a replica driver that raised (a deposed writer's part write) fails the test
              pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")]
pytest.importorskip("rensa")


def text(seed: int) -> str:
    rng = random.Random(seed)
    vocab = [f"word{i}" for i in range(2000)]
    return " ".join(rng.choice(vocab) for _ in range(300)) + "."


def test_two_replica_drivers_keep_one_copy_of_each_group(
        ray_local: None, redis_url: str, tmp_path: Path) -> None:
    groups = 30
    docs, ids = [], []
    for copy in range(3):  # copies spread over every shard: 90 sources, 6 shards
        for g in range(groups):
            body = text(g)
            if copy == 1:
                body = body.upper()  # an exact text copy once normalised
            elif copy == 2:
                body = body.replace("word1", "wordX", 2)  # a near copy
            docs.append(body)
            ids.append(f"g{g}-c{copy}")
    out = tmp_path / "out"
    scope = new_scope()
    run_id = create_run(TextQuality, [docs, ids], store=redis_url, out_dir=str(out),
                        kwargs={"dedup": "near", "claims": redis_url, "dedup_scope": scope},
                        shards=6, micro_batch=1, max_active_sources=1)
    # Driver a starts the run and holds every shard; b joins. a's caller then pauses until b
    # has delivered a document (a stalled driver renews no lease: b takes a's shards when
    # they lapse, or its share when a renews), so both drive shards however fast a is.
    a = join_run(run_id, store=redis_url, driver_id="a", lease_ttl_s=1.0, quiet=True)
    emitted = [next(a)[0]]
    b = join_run(run_id, store=redis_url, driver_id="b", lease_ttl_s=1.0, quiet=True)
    b_delivered = threading.Event()

    def drain_a() -> None:
        b_delivered.wait(120)
        emitted.extend(i for i, _ in a)

    def drain_b() -> None:
        for i, _ in b:
            emitted.append(i)
            b_delivered.set()

    threads = [threading.Thread(target=drain_a), threading.Thread(target=drain_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert b_delivered.is_set()  # b drove a shard while a stood still
    assert sorted(emitted) == list(range(len(docs)))
    records = {r["index"]: r for r in read_outputs(out)}
    assert sorted(records) == list(range(len(docs)))
    present = {ids[i] for i, r in records.items() if r["outcome"] == "present"}
    assert sorted(p.split("-")[0] for p in present) == sorted(f"g{g}" for g in range(groups))
    store = open_store(redis_url)
    try:
        from rayorch.inspect.drops import read_drops

        drops = read_drops(store, run_id)
        assert len(drops) == 2 * groups
        for index, drop in drops.items():
            assert drop.verdict["kept"] in present
            assert drop.verdict["kept"].split("-")[0] == ids[index].split("-")[0]
        holders = set(store.claims_of(scope).values())
        assert holders == present  # only kept documents entered the index
        from rayorch.core.facts import LeaseAcquired

        held = {s.fact.driver for facts in store.read_run(run_id).values() for s in facts
                if isinstance(s.fact, LeaseAcquired)}
        assert held == {"a", "b"}  # both drivers drove shards
        report = audit_run(store, run_id)
        assert report.ok, report.violations
    finally:
        store.close()
