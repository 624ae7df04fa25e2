"""The lineage store on a real Redis Cluster (3 masters, 3 replicas): failover and fencing.

The store contract itself runs on the cluster in ``test_store_contract.py``. Here a master
is killed: under a driver in the middle of a run, and while its replica lags behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from test_failover import REPO, emitted_counts, outputs_match_reference

from bench.faults import FaultPipeline, make_docs
from rayorch.cli import main as cli_main
from rayorch.core.facts import (
    GrainDispatched,
    GrainRetried,
    LeaseAcquired,
    RunCompleted,
    SourceAdmitted,
)
from rayorch.inspect.audit import audit_run
from rayorch.replicas import create_run
from rayorch.runtime.sinks import delivered_count
from rayorch.store import StoreAuthError, StoreUnavailableError, open_store
from rayorch.store.base import LineageStore
from rayorch.store.keys import ShardKeys
from rayorch.store.scripted_run import scripted_plan, write_scripted_run
from rayorch.testing import RedisClusterNodes, TlsFiles, redis_server_path

pytestmark = [pytest.mark.integration]


@pytest.fixture
def own_cluster(tmp_path: Path) -> RedisClusterNodes:
    """A cluster of this test's own (it kills nodes)."""
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    cluster = RedisClusterNodes(tmp_path / "cluster")
    cluster.start()
    yield cluster  # type: ignore[misc]
    cluster.stop()


def lease_epochs(store: LineageStore, run_id: str) -> dict[int, list[int]]:
    """Per shard, the epochs of its LeaseAcquired facts in store order."""
    return {
        shard: [s.fact.epoch for s in facts if isinstance(s.fact, LeaseAcquired)]
        for shard, facts in store.read_run(run_id).items()
    }


def fail_over(cluster: RedisClusterNodes, master: int, *, paused_replica: int | None = None
              ) -> None:
    """SIGKILL ``master`` (then wake ``paused_replica``), wait until a replica serves its
    slots, restart the old master: it comes back empty (no persistence), as a replica."""
    port = cluster.nodes[master].port
    cluster.kill(master)
    if paused_replica is not None:
        cluster.resume(paused_replica)
    cluster.wait_promoted(port)
    cluster.nodes[master].start()
    cluster.wait_healthy()


@pytest.mark.timeout(120)
def test_a_promoted_replica_never_hands_out_an_epoch_again(own_cluster: RedisClusterNodes
                                                           ) -> None:
    """A lease write that no replica acknowledged is never reported as acquired, so the
    epoch a promoted replica hands out next is one no driver was ever given."""
    url = f"{own_cluster.url}?wait_timeout_ms=300&retries=2"
    store = open_store(url)
    store.open_run("epochs", scripted_plan(), shards=1, micro_batch=1)
    given = [store.acquire_lease("epochs", 0, "a", ttl_s=0.3)]
    master = own_cluster.master_of(ShardKeys("epochs", 0).lease)
    replica = own_cluster.replica_of(master)
    time.sleep(0.4)  # a's lease expires
    own_cluster.pause(replica)  # the replica stops; then its link is cut: it gets nothing more
    assert own_cluster.cli_call(master, "client", "kill", "type", "replica").strip() == "1"
    try:
        given.append(store.acquire_lease("epochs", 0, "b", ttl_s=60))
    except StoreUnavailableError as exc:
        assert "acknowledged" in str(exc)
    finally:
        store.close()
        # The master dies before the replica wakes up (and could catch up): the replica,
        # without b's write, becomes the master.
        fail_over(own_cluster, master, paused_replica=replica)
    # A replica that has just finished its full sync acknowledges on its next one-second
    # tick: the healed cluster gets the default WAIT timeout, not the 300 ms above.
    store = open_store(own_cluster.url)
    given.append(store.acquire_lease("epochs", 0, "c", ttl_s=60))
    assert len(set(given)) == len(given), f"an epoch was handed out twice: {given}"
    (epochs,) = lease_epochs(store, "epochs").values()
    assert epochs == sorted(set(epochs)) and epochs[-1] == given[-1]


def _driver(run_id: str, url: str, address: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, "wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "rayorch.cli", "driver", run_id, "--store", url,
             "--address", address, "--driver-id", "first", "--lease-ttl", "2"],
            env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)


def _wait_outputs(out: Path, count: int, proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + 120
    while (done := delivered_count(out)) < count and time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    return done


@pytest.mark.long
@pytest.mark.timeout(300)
def test_master_killed_mid_run_the_run_completes_audits_and_resumes(
    ray_local: None, own_cluster: RedisClusterNodes, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """6 shards over 3 masters; the master holding most of them is SIGKILLed under a
    driver, then the driver too; ``rayorch resume`` finishes; nothing lost or repeated."""
    import ray

    url = own_cluster.url
    docs = make_docs(60)
    out = tmp_path / "out"
    run_id = create_run(FaultPipeline, [docs], store=url, kwargs={"gpu_ms": 40},
                        out_dir=str(out), shards=6, micro_batch=2, max_active_sources=4)
    homes = Counter(own_cluster.master_of(ShardKeys(run_id, k).lease) for k in range(6))
    victim, shards_on_victim = homes.most_common(1)[0]
    log = tmp_path / "driver.log"
    proc = _driver(run_id, url, ray.get_runtime_context().gcs_address, log)
    at_kill = _wait_outputs(out, 3, proc, log)
    store = open_store(url)
    before = store.read_run(run_id)
    store.close()
    fail_over(own_cluster, victim)
    _wait_outputs(out, at_kill + 3, proc, log)  # the driver goes on after the failover
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    store = open_store(url)
    assert len(emitted_counts(store, run_id)) < len(docs), "the resume must have work left"
    store.close()
    # The driver either saw the failover as a store outage (one line, backoff, rebuild) or
    # rode through it on the client's retries, depending on what it was doing: both are fine.
    assert cli_main(["resume", run_id, "--store", url, "--lease-ttl", "2", "--quiet"]) == 0
    assert cli_main(["audit", run_id, "--store", url]) == 0
    capsys.readouterr()
    store = open_store(url)
    after = store.read_run(run_id)
    for shard, facts in before.items():
        assert after[shard][: len(facts)] == facts, f"shard {shard} lost a fact in the failover"
    assert set(emitted_counts(store, run_id).values()) == {1}, "every output emitted once"
    outputs_match_reference(out, docs)
    assert audit_run(store, run_id).ok
    for shard, epochs in lease_epochs(store, run_id).items():
        assert epochs == sorted(set(epochs)), f"shard {shard}: epochs {epochs} repeat"
    assert shards_on_victim >= 2


@pytest.mark.timeout(120)
def test_auth_on_a_cluster_like_on_one_server(tmp_path: Path) -> None:
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    cluster = RedisClusterNodes(tmp_path / "cluster", password="s3cret")
    cluster.start()
    try:
        store = open_store(cluster.url)
        write_scripted_run(store, "authed", shards=6, micro_batch=1)
        assert audit_run(store, "authed").ok
        wrong = cluster.url.replace(":s3cret@", ":wrong@")
        with pytest.raises(StoreAuthError) as err:
            open_store(wrong).list_runs()
        assert "wrong" not in str(err.value) and ":***@" in str(err.value)
        with pytest.raises(StoreAuthError):
            open_store(cluster.url.replace(":s3cret@", "")).list_runs()
    finally:
        cluster.stop()
    with pytest.raises(StoreUnavailableError) as down:
        open_store(f"{cluster.url}?retries=1").list_runs()
    assert "s3cret" not in str(down.value)


@pytest.mark.timeout(120)
def test_tls_on_a_cluster(tmp_path: Path) -> None:
    """``rediss+cluster://`` with a CA: every node, the cluster bus and replication speak TLS."""
    if redis_server_path() is None or shutil.which("openssl") is None:
        pytest.skip("redis-server or openssl is not installed")
    cluster = RedisClusterNodes(tmp_path / "cluster", tls=TlsFiles.make(tmp_path / "tls"))
    cluster.start()
    try:
        assert cluster.url.startswith("rediss+cluster://")
        store = open_store(cluster.url)
        write_scripted_run(store, "sealed", shards=6, micro_batch=1)
        assert audit_run(store, "sealed").ok
        plain = cluster.url.replace("rediss+", "redis+").partition("?")[0]
        with pytest.raises(StoreUnavailableError):
            open_store(f"{plain}?retries=1").list_runs()
    finally:
        cluster.stop()


@pytest.mark.timeout(120)
def test_a_planned_failover_is_followed_through_moved(own_cluster: RedisClusterNodes) -> None:
    """``CLUSTER FAILOVER`` on a replica: the old master answers MOVED to a store whose slot
    map is stale, and the new master has no scripts (NOSCRIPT); both are followed."""
    store = open_store(own_cluster.url)
    write_scripted_run(store, "moved", shards=6, micro_batch=1, complete=False)
    before = store.read_run("moved")
    master = own_cluster.master_of(ShardKeys("moved", 0).lease)
    replica = own_cluster.replica_of(master)
    assert own_cluster.cli_call(replica, "cluster", "failover").strip() == "OK"
    own_cluster.wait_promoted(own_cluster.nodes[master].port)
    epoch = store.acquire_lease("moved", 0, "next", ttl_s=60)  # MOVED, then NOSCRIPT
    store.append("moved", 0, epoch, [RunCompleted(1)], driver="next")
    assert store.read_run("moved")[0][: len(before[0])] == before[0]
    assert lease_epochs(store, "moved")[0][-1] == epoch


def _node_id(cluster: RedisClusterNodes, node: int) -> str:
    return cluster.cli_call(node, "cluster", "myid").strip()


@pytest.mark.timeout(120)
def test_a_slot_in_migration_is_followed_through_ask(own_cluster: RedisClusterNodes) -> None:
    """Resharding moves shard 0's slot to another master: once its keys have moved, the old
    owner answers ASK and the write lands on the new owner after ASKING; while only some
    have moved, Redis answers TRYAGAIN and the store reports an outage (callers retry)."""
    from redis.crc import key_slot

    store = open_store(f"{own_cluster.url}?retries=2")
    store.open_run("asked", scripted_plan(), shards=1, micro_batch=1)
    keys = ShardKeys("asked", 0)
    epoch = store.acquire_lease("asked", 0, "d", ttl_s=60)
    store.append("asked", 0, epoch, [SourceAdmitted(0, ("a",)),
                                     GrainDispatched("render", (0,), 0)], driver="d")
    slot = key_slot(keys.lease.encode())
    source = own_cluster.master_of(keys.lease)
    target = next(i for i, n in enumerate(own_cluster.nodes)
                  if n.port in own_cluster.master_ports() and i != source)
    src_id, dst_id = _node_id(own_cluster, source), _node_id(own_cluster, target)
    own_cluster.cli_call(target, "cluster", "setslot", str(slot), "importing", src_id)
    own_cluster.cli_call(source, "cluster", "setslot", str(slot), "migrating", dst_id)
    moving = own_cluster.cli_call(source, "cluster", "getkeysinslot", str(slot), "100").split()
    bucket = keys.grain_bucket("0")  # render of source 0
    assert keys.lease in moving and bucket in moving
    port = str(own_cluster.nodes[target].port)
    own_cluster.cli_call(source, "migrate", "127.0.0.1", port, "", "0", "5000", "KEYS",
                         bucket)
    with pytest.raises(StoreUnavailableError, match="cluster"):
        store.append("asked", 0, epoch, [GrainRetried("render", (0,), 1, "crash")],
                     driver="d")
    rest = [k for k in moving if k != bucket]
    own_cluster.cli_call(source, "migrate", "127.0.0.1", port, "", "0", "5000", "KEYS", *rest)
    store.append("asked", 0, epoch, [GrainRetried("render", (0,), 1, "crash")],  # ASK
                 driver="d")
    for node in (target, source):  # the migration ends: the target owns the slot
        own_cluster.cli_call(node, "cluster", "setslot", str(slot), "node", dst_id)
    assert own_cluster.master_of(keys.lease) == target
    facts = [type(s.fact).__name__ for s in store.read_run("asked")[0]]
    assert facts == ["LeaseAcquired", "SourceAdmitted", "GrainDispatched", "GrainRetried"]


@pytest.mark.timeout(120)
def test_a_cluster_without_replicas_names_wait_replicas_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three masters, no replicas, the default wait_replicas=1: the job says at once that no
    replica can acknowledge and how to run without (it used to time out every write with
    "cannot reach the lineage store"); with ?wait_replicas=0 the same job runs."""
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    cluster = RedisClusterNodes(tmp_path / "cluster", replicas=0)
    cluster.start()
    try:
        pdfs = REPO / "examples" / "pdfs"
        code = cli_main(["run", "pdf", "--input", str(pdfs), "--output", str(tmp_path / "a"),
                         "--ocr", "text", "--store", cluster.url])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
        assert "cannot acknowledge writes: each waits for 1 replica(s) (wait_replicas)" in err[0]
        assert "has 0 connected" in err[0] and "?wait_replicas=0" in err[0], err[0]
        assert "redis-server is running" not in err[0]
        assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
        assert cli_main(["run", "pdf", "--input", str(pdfs), "--output", str(tmp_path / "b"),
                         "--ocr", "text", "--store", f"{cluster.url}?wait_replicas=0"]) == 0
    finally:
        cluster.stop()


@pytest.mark.timeout(120)
def test_a_run_started_before_the_cluster_serves_its_slots_says_so(tmp_path: Path) -> None:
    """Nodes up, `redis-cli --cluster create` not finished: no slot served at all (redis-py
    found no primary and raised a bare IndexError), then only one node's slots (the server
    version probe read one node's answer as if keyed by node). Both say what to wait for."""
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    cluster = RedisClusterNodes(tmp_path / "cluster", replicas=0)
    for node in cluster.nodes:
        node.start()
    try:
        with pytest.raises(StoreUnavailableError) as none:
            open_store(f"{cluster.url}?wait_replicas=0").open_run("early", scripted_plan())
        assert "the cluster serves no hash slots yet" in str(none.value)
        assert "wait until `redis-cli --cluster create` has finished" in str(none.value)
        assert "OK" in cluster.cli_call(0, "cluster", "addslotsrange", "0", "5000")
        with pytest.raises(StoreUnavailableError) as some:
            open_store(f"{cluster.url}?wait_replicas=0").check()
        assert "the cluster does not serve all its slots yet" in str(some.value)
        assert "wait until `redis-cli --cluster create`" in str(some.value)
    finally:
        cluster.stop()
