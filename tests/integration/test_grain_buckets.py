"""The Redis store's Grain table in buckets (issue 37: at most 1 KB of Redis per page in flight
on the region path), on a real redis-server, seen from outside with redis-py: a page's Grains
live in one small hash that Redis keeps as a listpack (a source's, in a plan of one expansion
level), a delivered source's buckets leave with its archive (a Grain still in flight keeps its
entry), a done shard keeps none, and a run written before buckets keeps its one hash
(rayorch/store/keys.py, ``GrainKeys``)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.lineage_archive import DRIVER, RegionRun, region_plan
from rayorch.core.errors import StoreError
from rayorch.core.facts import (
    REPORT_PRESENT,
    GrainCommitted,
    GrainDispatched,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.core.vocabulary import CommitVerdict, GrainPhase
from rayorch.store.errors import GrainSealedError, StoreRolledBackError
from rayorch.store.keys import GRAIN_TABLE_FIELD, ShardKeys, meta_key
from rayorch.store.layout import AppendBasis
from rayorch.store.registry import open_store
from rayorch.store.scripted_run import scripted_plan, write_scripted_run
from rayorch.testing import RedisClusterNodes, RedisServer

pytestmark = pytest.mark.integration
PAGES, REGIONS = 3, 8


def buckets(client: Any, run_id: str) -> dict[str, set[str]]:
    """Every Grain bucket of shard 0 of the run: bucket name -> its fields."""
    prefix = ShardKeys(run_id, 0).grains + ":"
    return {key.decode()[len(prefix):]: {f.decode() for f in client.hkeys(key)}
            for key in client.scan_iter(match=prefix + "*")}


def page_fields(source: int, page: int) -> set[str]:
    return ({f"layout|{source}.{page}", f"page|{source}.{page}"}
            | {f"rec|{source}.{page}.{r}" for r in range(REGIONS)})


@pytest.mark.parametrize("backend", ["redis", "redis-cluster"])
def test_a_pages_grains_live_in_one_listpack_and_a_delivered_sources_buckets_go_with_its_archive(
        backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Region path, 2 sources x 3 pages x 8 regions in flight: each page's 10 Grains (layout,
    8 regions, page) are one listpack-encoded hash, each source's root Grains another. Once
    source 0 and 1 are delivered and archived, their buckets are gone but for the entry of
    a Grain still in flight (an extra region, never reported); sources 2 and 3, not
    delivered, keep theirs (the commit gate still refuses their duplicates); once the shard
    is done and archived, no bucket is left. On a Redis Cluster too (the buckets are found
    on the master of the shard's slot)."""
    client: Any
    if backend == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        url, client = server.url, redis.Redis.from_url(server.url)
    else:
        cluster: RedisClusterNodes = request.getfixturevalue("redis_cluster")
        url = cluster.url
        client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    run_id = f"pages-{uuid.uuid4().hex[:8]}"  # the cluster is shared by the session
    store = open_store(f"{url}?archive={tmp_path / 'archive'}"
                       "&archive_every=1000000")  # archived only when asked
    store.open_run(run_id, region_plan(), shards=1, micro_batch=4)
    epoch = store.acquire_lease(run_id, 0, DRIVER, ttl_s=600)
    run = RegionRun(store, run_id, PAGES, REGIONS)
    for step in range(4):  # rendered, laid out, regions recognized, pages dispatched
        run.advance(0, epoch, [0, 1], step)
    store.append(run_id, 0, epoch, [GrainDispatched("rec", (0, 2, REGIONS), 0)], driver=DRIVER)
    expected = {str(s): {f"render|{s}"} for s in (0, 1)}
    expected |= {f"{s}.{p}": page_fields(s, p) for s in (0, 1) for p in range(PAGES)}
    expected["0.2"].add(f"rec|0.2.{REGIONS}")
    assert buckets(client, run_id) == expected
    assert not client.exists(ShardKeys(run_id, 0).grains)  # no one big hash
    for bucket in expected:
        key = ShardKeys(run_id, 0).grain_bucket(bucket)
        assert client.object("encoding", key) == b"listpack", bucket
    assert store.grain_phase(run_id, 0, "rec", (1, 2, 7)) == (GrainPhase.SEALED, 0)
    assert store.grain_phase(run_id, 0, "page", (1, 2)) == (GrainPhase.IN_FLIGHT, 0)

    for step in (4, 5):  # pages and sources 0, 1 assembled and delivered
        run.advance(0, epoch, [0, 1], step)
    for step in range(4):
        run.advance(0, epoch, [2, 3], step)
    store.archive_shard(run_id, 0, done=False)
    left = buckets(client, run_id)
    assert left["0.2"] == {f"rec|0.2.{REGIONS}"}  # in flight: kept
    assert left == {"0.2": {f"rec|0.2.{REGIONS}"}, "2": {"render|2"}, "3": {"render|3"}} | {
        f"{s}.{p}": page_fields(s, p) for s in (2, 3) for p in range(PAGES)}
    late = [GrainCommitted("rec", (0, 1, 3), 0, REPORT_PRESENT, ("t",)),
            GrainCommitted("rec", (2, 1, 3), 0, REPORT_PRESENT, ("t",))]
    assert store.commit(run_id, late) == [CommitVerdict.NOT_DISPATCHED, CommitVerdict.SEALED]

    for step in (4, 5):
        run.advance(0, epoch, [2, 3], step)
    store.append(run_id, 0, epoch, [RunCompleted(4)], driver=DRIVER)
    store.archive_shard(run_id, 0, done=True)
    assert buckets(client, run_id) == {}
    assert store.commit(run_id, late) == [CommitVerdict.NOT_DISPATCHED] * 2
    store.close()


def test_a_run_written_before_buckets_keeps_its_one_grain_hash(redis_server: RedisServer,
                                                               tmp_path: Path) -> None:
    """A run whose meta does not name its Grain table (written before buckets) keeps the one
    hash ``ro:{run:k}:grains``: commits, the fenced append, the archive's trim of delivered
    sources and the done shard's delete all use it, and no bucket is made. A run naming a
    table this version does not know is refused with the cause."""
    client = redis.Redis.from_url(redis_server.url)
    with open_store(redis_server.url) as store:
        store.open_run("old", scripted_plan(), shards=1, micro_batch=2)
    client.hdel(meta_key("old"), GRAIN_TABLE_FIELD)  # as a run opened before buckets
    store = open_store(f"{redis_server.url}?archive={tmp_path / 'archive'}"
                       "&archive_every=1000000")
    write_scripted_run(store, "old", shards=1)
    table = ShardKeys("old", 0).grains
    assert client.hlen(table) > 0 and buckets(client, "old") == {}
    assert store.grain_phase("old", 0, "ocr", (0, 1)) == (GrainPhase.SEALED, 0)
    assert store.commit("old", [GrainCommitted("ocr", (0, 1), 0, REPORT_PRESENT, ("t",))]) \
        == [CommitVerdict.SEALED]
    store.archive_shard("old", 0, done=False)  # every source is delivered
    left = client.hgetall(table)  # the Grains barred in flight by source 3's group failure
    assert left and all(not v.startswith(b"3:") for v in left.values()), left
    assert buckets(client, "old") == {}
    store.archive_shard("old", 0, done=True)
    assert not client.exists(table)
    assert store.read_run("old")  # the facts read back from the archive
    store.close()

    with open_store(redis_server.url) as store:
        store.open_run("future", scripted_plan(), shards=1)
    client.hset(meta_key("future"), GRAIN_TABLE_FIELD, "trees")
    with open_store(redis_server.url) as store, \
            pytest.raises(StoreError, match="keeps its Grain table as 'trees'"):
        store.run_info("future")


def test_deleting_a_run_deletes_its_buckets_and_no_other_runs(redis_server: RedisServer) -> None:
    """``delete_run`` finds a run's buckets by SCAN: run ``a`` loses every key, ``a1`` (whose
    keys share the prefix ``ro:{a``) keeps all of its own."""
    client = redis.Redis.from_url(redis_server.url)
    with open_store(redis_server.url) as store:
        write_scripted_run(store, "a", shards=2)
        write_scripted_run(store, "a1", shards=2)
        before = {k for k in client.scan_iter(match="ro:{a1*")}
        assert any(b":grains:" in k for k in before)
        store.delete_run("a")
    assert not list(client.scan_iter(match="ro:{a:*")) and not client.exists("ro:{a}:meta")
    assert {k for k in client.scan_iter(match="ro:{a1*")} == before


def test_a_store_gone_back_behind_its_archive_rebuilds_the_grain_buckets(
        redis_server: RedisServer, tmp_path: Path) -> None:
    """A plan of one expansion level keeps a bucket per source (a listpack). Redis goes back
    behind the archive (its seq counter and Grain buckets lost, as after a restore from an
    old snapshot): the next read raises the counter to the archive's
    watermark and writes every Grain's entry as the archived facts leave it, each in its own
    bucket, so the commit gate still refuses a duplicate of an archived commit."""
    client = redis.Redis.from_url(redis_server.url)
    store = open_store(f"{redis_server.url}?archive={tmp_path / 'archive'}"
                       "&archive_every=1000000")
    write_scripted_run(store, "back", shards=1, micro_batch=4)
    before = buckets(client, "back")
    assert set(before) == {"0", "1", "2", "3"}  # one expansion level: a bucket per source
    assert before["1"] == {"render|1", "ocr|1.0", "assemble|1"}
    keys = ShardKeys("back", 0)
    assert {client.object("encoding", keys.grain_bucket(b)) for b in before} == {b"listpack"}
    facts = store.read_run("back")
    store.archive_shard("back", 0, done=False)
    client.delete(keys.seq, keys.archived, *(keys.grain_bucket(b) for b in before))
    assert store.read_run("back") == facts  # the read catches the store up first
    assert int(client.get(keys.seq) or 0) == facts[0][-1].seq
    assert buckets(client, "back") == before
    assert store.grain_phase("back", 0, "ocr", (3, 4)) == (GrainPhase.IN_FLIGHT, 0)  # barred
    assert store.commit("back", [GrainCommitted("ocr", (0, 2), 0, REPORT_PRESENT, ("t",))]) \
        == [CommitVerdict.SEALED]
    store.close()


def test_an_append_checks_its_basis_and_its_grains_in_their_buckets(
        redis_server: RedisServer) -> None:
    """Region path: the fenced append finds each Grain's entry in its page's bucket, for the
    commits its basis rests on (one sealed, one not: refused as a store gone back) and for
    the facts it appends (a dispatch of a sealed region: refused, nothing written)."""
    store = open_store(redis_server.url)
    store.open_run("basis", region_plan(), shards=1, micro_batch=4)
    epoch = store.acquire_lease("basis", 0, DRIVER, ttl_s=600)
    regions = [(0, 1, 0), (0, 1, 1), (0, 2, 0)]
    first = store.append("basis", 0, epoch, [GrainDispatched("rec", g, 0) for g in regions],
                         driver=DRIVER)[0]
    report = GrainCommitted("rec", (0, 1, 1), 0, REPORT_PRESENT, ("t",))
    assert store.commit("basis", [report]) == [CommitVerdict.ACCEPTED]
    facts = store.read("basis", 0)
    with pytest.raises(StoreRolledBackError, match=r"rec\[0\.2\.0\] generation 0"):
        store.append("basis", 0, epoch, [SourceAdmitted(1, ("b",))], driver=DRIVER,
                     basis=AppendBasis(1, first, (("rec", (0, 1, 1), 0), ("rec", (0, 2, 0), 0))))
    with pytest.raises(GrainSealedError):
        store.append("basis", 0, epoch, [GrainDispatched("rec", (0, 1, 1), 1)], driver=DRIVER,
                     basis=AppendBasis(1, first, (("rec", (0, 1, 1), 0),)))
    assert store.read("basis", 0) == facts  # nothing written
    store.append("basis", 0, epoch, [GrainDispatched("rec", (0, 2, 1), 0)], driver=DRIVER,
                 basis=AppendBasis(1, first, (("rec", (0, 1, 1), 0),)))
    assert store.grain_phase("basis", 0, "rec", (0, 2, 1)) == (GrainPhase.IN_FLIGHT, 0)
    store.close()
