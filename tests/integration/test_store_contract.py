"""One contract per store interface (``FactLog``, ``Leases``, ``RunRegistry``,
``DriverRegistry``), each run over every backend: the memory store, a real redis-server and a
real Redis Cluster (3 masters, 3 replicas). A new backend is one more entry in ``BACKENDS``."""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rayorch.core.commit import CommitVerdict, GrainPhase
from rayorch.core.facts import (
    REPORT_GROUP_FAILURE,
    REPORT_PRESENT,
    REPORT_RECORD_FAILURE,
    BarrierInstalled,
    ExpansionClosed,
    Fact,
    GrainCommitted,
    GrainDispatched,
    GrainFailed,
    GrainRetried,
    GrainReused,
    LeaseAcquired,
    SourceAdmitted,
)
from rayorch.core.plan import Plan
from rayorch.store import (
    AppendBasis,
    FactNotAllowedError,
    FencedError,
    GrainSealedError,
    InvalidRunIdError,
    LeaseHeldError,
    LeaseLostError,
    LineageStore,
    RunMismatchError,
    RunNotFoundError,
    StoreRolledBackError,
    UnknownRunPartError,
    open_store,
)
from rayorch.store.memory_log import BLOCK
from rayorch.store.scripted_run import scripted_plan, write_scripted_run

pytestmark = pytest.mark.integration

PLAN: Plan = scripted_plan()


def committed(call: str, path: tuple[int, ...], gen: int = 0, outcome: str = REPORT_PRESENT,
              value: object = "v") -> GrainCommitted:
    outputs = (value,) if outcome == REPORT_PRESENT else None
    cause = None if outcome == REPORT_PRESENT else "boom"
    return GrainCommitted(call, path, gen, outcome, outputs, cause)


BACKENDS = ["memory", "redis", "redis-cluster"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LineageStore]:
    if request.param == "memory":
        opened = open_store("memory://")
    else:
        url = (request.getfixturevalue("redis_url") if request.param == "redis"
               else request.getfixturevalue("redis_cluster").url)
        opened = open_store(f"{url}?payload_dir={tmp_path / 'payloads'}")
    yield opened
    opened.close()


@pytest.fixture
def run(store: LineageStore) -> str:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    store.open_run(run_id, PLAN, shards=2, micro_batch=2, config={"note": "contract"})
    return run_id


@pytest.fixture
def epoch(store: LineageStore, run: str) -> int:
    return store.acquire_lease(run, 0, "driver-a", ttl_s=60)


class TestRunRegistry:
    """Runs: create, reopen, refuse a mismatch, list, delete; manifests."""

    def test_open_run_records_plan_and_config(self, store: LineageStore, run: str) -> None:
        info = store.run_info(run)
        assert info.fingerprint == PLAN.fingerprint()
        assert Plan.from_description(info.plan).fingerprint() == PLAN.fingerprint()
        assert (info.shards, info.micro_batch, info.config) == (2, 2, {"note": "contract"})
        assert info.domains == ("root", "root/0")
        assert run in [i.run_id for i in store.list_runs()]

    def test_reopen_same_plan_is_the_same_run(self, store: LineageStore, run: str) -> None:
        again = store.open_run(run, PLAN.describe(), shards=2, micro_batch=2)
        assert again.fingerprint == store.run_info(run).fingerprint

    def test_reopen_with_other_plan_or_shards_is_refused(self, store: LineageStore, run: str
                                                         ) -> None:
        other = PLAN.describe()
        other["nodes"][1]["call"]["id"] = "render2"
        with pytest.raises(RunMismatchError, match="plan fingerprint"):
            store.open_run(run, other, shards=2, micro_batch=2)
        with pytest.raises(RunMismatchError, match="shards"):
            store.open_run(run, PLAN, shards=3, micro_batch=2)

    def test_unknown_run_and_bad_run_id(self, store: LineageStore) -> None:
        with pytest.raises(RunNotFoundError, match="run 'nope' not found"):
            store.run_info("nope")
        with pytest.raises(RunNotFoundError):
            store.read("nope", 0)
        with pytest.raises(InvalidRunIdError):
            store.open_run("bad:id", PLAN)

    def test_delete_run(self, store: LineageStore, run: str, epoch: int) -> None:
        store.append(run, 0, epoch, [SourceAdmitted(0, ("a",)), GrainDispatched("render", (0,), 0)],
                     driver="driver-a")
        store.delete_run(run)
        with pytest.raises(RunNotFoundError):
            store.run_info(run)
        store.open_run(run, PLAN, shards=2, micro_batch=2)
        assert store.read(run, 0) == []
        assert store.grain_phase(run, 0, "render", (0,)) is None  # no Grain entry is left

    def test_manifest_first_writer_wins(self, store: LineageStore, run: str) -> None:
        assert store.load_manifest(run) is None
        assert store.save_manifest(run, b"first") == b"first"
        assert store.save_manifest(run, b"second") == b"first"
        assert store.load_manifest(run) == b"first"
        with pytest.raises(RunNotFoundError):
            store.save_manifest("nope", b"x")


class TestDriverRegistry:
    """Heartbeats in the store's clock, live drivers, finished shards."""

    def test_heartbeats_and_live_drivers(self, store: LineageStore, run: str) -> None:
        store.heartbeat(run, "b", 30)
        store.heartbeat(run, "a", 30)
        store.heartbeat(run, "c", 0.05)
        time.sleep(0.2)
        assert store.live_drivers(run) == ["a", "b"]
        now, deadlines = store.driver_registry(run)
        assert set(deadlines) == {"a", "b", "c"}  # expired entries too
        assert deadlines["c"] <= now < deadlines["a"] <= now + 30
        store.heartbeat(run, "b", 0)  # left
        assert store.live_drivers(run) == ["a"]
        assert "b" not in store.driver_registry(run)[1]

    def test_done_shards(self, store: LineageStore, run: str) -> None:
        assert store.done_shards(run) == frozenset()
        store.mark_shard_done(run, 1)
        store.mark_shard_done(run, 1)
        assert store.done_shards(run) == frozenset({1})
        with pytest.raises(UnknownRunPartError, match="shard 2"):
            store.mark_shard_done(run, 2)

    def test_the_sink_a_driver_records_is_kept_first_write_wins(
            self, store: LineageStore, run: str) -> None:
        assert store.run_info(run).sink is None
        assert store.record_sink(run, "/data/out", "parquet") == ("/data/out", "parquet")
        assert store.record_sink(run, "/elsewhere", "jsonl") == ("/data/out", "parquet")
        assert store.run_info(run).sink == ("/data/out", "parquet")


class TestPoolLog:
    """The pool log: size changes of a run's pools, in order, gone with the run."""

    def test_the_pool_log_keeps_records_in_order_and_goes_with_the_run(
            self, store: LineageStore, run: str) -> None:
        assert store.pool_sizes(run) == []
        store.record_pool_sizes(run, [b"a", b"b"])
        store.record_pool_sizes(run, [b"c"])
        assert store.pool_sizes(run) == [b"a", b"b", b"c"]
        store.delete_run(run)
        with pytest.raises(RunNotFoundError):
            store.record_pool_sizes(run, [b"d"])


class TestLeases:
    """One live holder per shard; epochs only go forward; a deposed driver is fenced."""

    def test_lease_epochs_only_go_forward(self, store: LineageStore, run: str) -> None:
        first = store.acquire_lease(run, 0, "driver-a", ttl_s=60)
        assert store.acquire_lease(run, 0, "driver-a", ttl_s=60) == first
        with pytest.raises(LeaseHeldError, match="driver-a"):
            store.acquire_lease(run, 0, "driver-b", ttl_s=60)
        store.release_lease(run, 0, "driver-a", first)
        assert store.lease_holder(run, 0) is None
        second = store.acquire_lease(run, 0, "driver-b", ttl_s=60)
        assert second == first + 1
        assert store.lease_holder(run, 0) == ("driver-b", second)
        leases = [f.fact for f in store.read(run, 0) if isinstance(f.fact, LeaseAcquired)]
        assert [(f.driver, f.epoch, f.shard) for f in leases] == [
            ("driver-a", first, 0), ("driver-b", second, 0)]
        assert store.acquire_lease(run, 1, "driver-a", ttl_s=60) == 1  # per shard

    def test_deposed_driver_is_fenced(self, store: LineageStore, run: str) -> None:
        old = store.acquire_lease(run, 0, "driver-a", ttl_s=0.2)
        time.sleep(0.3)
        with pytest.raises(LeaseLostError) as lost:
            store.append(run, 0, old, [SourceAdmitted(0, ("a",))], driver="driver-a")
        assert not isinstance(lost.value, FencedError)
        new = store.acquire_lease(run, 0, "driver-b", ttl_s=60)
        assert new == old + 1
        before = store.read(run, 0)
        with pytest.raises(FencedError, match=f"epoch {new}"):
            store.append(run, 0, old, [SourceAdmitted(0, ("a",))], driver="driver-a")
        with pytest.raises(FencedError):
            store.renew_lease(run, 0, "driver-a", old, ttl_s=60)
        assert store.read(run, 0) == before
        store.renew_lease(run, 0, "driver-b", new, ttl_s=60)

    def test_deposed_driver_wakes_after_another_continued(self, store: LineageStore, run: str
                                                          ) -> None:
        # driver-a stops renewing past its TTL (SIGSTOP); driver-b takes over, writes, then
        # finishes and releases; driver-a wakes up (SIGCONT) and tries to carry on.
        old = store.acquire_lease(run, 0, "driver-a", ttl_s=0.2)
        store.append(run, 0, old, [SourceAdmitted(0, ("a",))], driver="driver-a")
        time.sleep(0.3)
        new = store.acquire_lease(run, 0, "driver-b", ttl_s=60)
        lost = (f"^lease lost: run '{run}' shard 0 was continued by driver 'driver-b' "
                f"\\(epoch {new}\\);[^\\n]*$")
        for phase in ("driver-b holds it", "driver-b released it"):
            with pytest.raises(FencedError, match=lost):
                store.acquire_lease(run, 0, "driver-a", ttl_s=60, after_epoch=old)
            with pytest.raises(FencedError, match=lost):
                store.append(run, 0, old, [SourceAdmitted(1, ("from-a",))], driver="driver-a")
            with pytest.raises(FencedError, match=lost):
                store.renew_lease(run, 0, "driver-a", old, ttl_s=60)
            if phase == "driver-b holds it":
                store.append(run, 0, new, [SourceAdmitted(1, ("from-b",))], driver="driver-b")
                store.release_lease(run, 0, "driver-b", new)
        assert store.lease_holder(run, 0) is None  # the refused driver took nothing
        admitted = [f.fact for f in store.read(run, 0) if isinstance(f.fact, SourceAdmitted)]
        assert admitted == [SourceAdmitted(0, ("a",)), SourceAdmitted(1, ("from-b",))]
        assert store.acquire_lease(run, 0, "driver-c", ttl_s=60) == new + 1

    def test_lapsed_lease_is_taken_back_only_if_nobody_held_it(self, store: LineageStore,
                                                               run: str) -> None:
        old = store.acquire_lease(run, 0, "driver-a", ttl_s=0.2)
        assert store.acquire_lease(run, 0, "driver-a", ttl_s=0.2, after_epoch=old) == old
        time.sleep(0.3)
        with pytest.raises(LeaseLostError) as lost:
            store.append(run, 0, old, [SourceAdmitted(0, ("a",))], driver="driver-a")
        assert not isinstance(lost.value, FencedError)
        again = store.acquire_lease(run, 0, "driver-a", ttl_s=60, after_epoch=old)
        assert again == old + 1  # a new epoch: anything in flight under the old one is fenced
        store.append(run, 0, again, [SourceAdmitted(0, ("a",))], driver="driver-a")
        with pytest.raises(FencedError, match=f"continued by driver 'driver-a' \\(epoch {again}"):
            store.append(run, 0, old, [SourceAdmitted(1, ("b",))], driver="driver-a")

    def test_fenced_writes_check_the_driver_as_well_as_the_epoch(self, store: LineageStore,
                                                                 run: str) -> None:
        epoch = store.acquire_lease(run, 0, "driver-a", ttl_s=60)
        before = store.read(run, 0)
        with pytest.raises(FencedError, match="continued by driver 'driver-a'"):
            store.append(run, 0, epoch, [SourceAdmitted(0, ("a",))], driver="driver-b")
        with pytest.raises(FencedError):
            store.renew_lease(run, 0, "driver-b", epoch, ttl_s=60)
        store.release_lease(run, 0, "driver-b", epoch)  # not its lease: nothing happens
        assert store.lease_holder(run, 0) == ("driver-a", epoch)
        assert store.read(run, 0) == before



class TestFactLog:
    """Fenced appends, reads in the shard's order, the commit gate."""

    # -- append / read -----------------------------------------------------------
    def test_read_back_equals_appended_in_order(self, store: LineageStore, run: str, epoch: int
                                                ) -> None:
        facts = [
            SourceAdmitted(0, ("a.pdf",), key="a", ts=1.5),
            GrainDispatched("render", (0,), 0),
            ExpansionClosed("root/0", (1,), "succeeded", 2),
            GrainDispatched("ocr", (1, 0), 0),
            GrainRetried("ocr", (1, 0), 1, "crash"),
            GrainDispatched("assemble", (1,), 0),
        ]
        seqs = store.append(run, 0, epoch, facts, driver="driver-a")
        assert seqs == [epoch_seq + 2 for epoch_seq in range(len(facts))]  # 1 = LeaseAcquired
        stored = store.read(run, 0)[1:]
        assert [s.fact for s in stored] == facts
        assert [s.seq for s in stored] == seqs
        assert [s.domain for s in stored] == ["root", "root", "root/0", "root/0", "root/0", "root"]
        assert stored[0].fact.ts == 1.5
        only_children = store.read(run, 0, domain="root/0")
        assert [s.seq for s in only_children] == [seqs[2], seqs[3], seqs[4]]
        assert store.read(run, 0, after=seqs[3], limit=1)[0].fact == facts[4]
        assert [s.fact for s in store.iter_facts(run, 0)][1:] == facts

    def test_paged_reads_merge_domains_without_gaps(self, store: LineageStore, run: str,
                                                    epoch: int) -> None:
        facts = []
        for i in range(30):
            facts.append(GrainDispatched("ocr", (0, i), 0) if i % 3 else
                         GrainDispatched("render", (i % 2,), i))
        store.append(run, 0, epoch, facts, driver="driver-a")
        pages, cursor = [], 0
        while batch := store.read(run, 0, cursor, limit=4):
            pages.append(batch)
            cursor = batch[-1].seq
        seqs = [s.seq for page in pages for s in page]
        assert seqs == list(range(1, 32))

    def test_a_long_shard_reads_back_whole_by_domain_and_from_any_cursor(
            self, store: LineageStore, run: str, epoch: int) -> None:
        """More facts than the memory store keeps as objects (it moves them into segments):
        every read sees the facts as written, an undelivered source's value too."""
        n = 3 * BLOCK + 5
        store.append(run, 0, epoch, [GrainDispatched("render", (4,), 0)], driver="driver-a")
        facts: list[Fact] = [GrainDispatched("ocr", (0, i), 0) if i % 3 else
                             GrainDispatched("render", (i % 2,), i) for i in range(n)]
        store.append(run, 0, epoch, facts[:BLOCK], driver="driver-a")
        value = {"text": "x" * 5000, "pages": list(range(40))}
        verdicts = store.commit(run, [committed("render", (4,), value=value)])
        assert verdicts == [CommitVerdict.ACCEPTED]
        store.append(run, 0, epoch, facts[BLOCK:], driver="driver-a")
        written = [LeaseAcquired(0, "driver-a", epoch), GrainDispatched("render", (4,), 0),
                   *facts[:BLOCK], committed("render", (4,), value=value), *facts[BLOCK:]]
        read = [s.fact for s in store.iter_facts(run, 0)]
        assert read[:BLOCK + 2] + read[BLOCK + 3:] == written[:BLOCK + 2] + written[BLOCK + 3:]
        commit = read[BLOCK + 2]  # on Redis with its payload reference beside it
        assert isinstance(commit, GrainCommitted) and commit.outputs == (value,)
        children = [s for s in store.iter_facts(run, 0, domain="root/0")]
        assert [s.fact for s in children] == [f for f in written
                                              if isinstance(f, GrainDispatched) and f.call == "ocr"]
        for after in (0, 1, BLOCK - 1, BLOCK + 2, 2 * BLOCK - 2, 2 * BLOCK + 7, n + 1):
            got = store.read(run, 0, after, limit=5)
            assert [s.seq for s in got] == list(range(after + 1, min(after + 5, n + 3) + 1))
            assert [s.fact for s in got] == read[after:after + 5]

    def test_blocking_read_wakes_on_append(self, store: LineageStore, run: str, epoch: int
                                           ) -> None:
        cursor = store.read(run, 0)[-1].seq
        start = time.monotonic()
        assert store.read(run, 0, cursor, block_s=0.2) == []
        assert time.monotonic() - start >= 0.15
        timer = threading.Timer(0.2, store.append, (run, 0, epoch, [SourceAdmitted(0, ("a",))]),
                                {"driver": "driver-a"})
        timer.start()
        try:
            got = store.read(run, 0, cursor, block_s=10)
        finally:
            timer.join()
        assert [s.fact for s in got] == [SourceAdmitted(0, ("a",))]

    def test_append_checks_shard_and_fact_kinds(self, store: LineageStore, run: str, epoch: int
                                                ) -> None:
        with pytest.raises(UnknownRunPartError, match="shard 1"):
            # (2 // 2) % 2 == 1
            store.append(run, 0, epoch, [SourceAdmitted(2, ("c",))], driver="driver-a")
        with pytest.raises(FactNotAllowedError):
            store.append(run, 0, epoch, [committed("render", (0,))], driver="driver-a")
        with pytest.raises(FactNotAllowedError):
            store.append(run, 0, epoch, [BarrierInstalled("ocr", (0,))], driver="driver-a")
        with pytest.raises(UnknownRunPartError, match="'nope'"):
            store.append(run, 0, epoch, [GrainDispatched("nope", (0,), 0)], driver="driver-a")
        with pytest.raises(UnknownRunPartError, match="depth"):
            store.append(run, 0, epoch, [GrainDispatched("ocr", (0,), 0)], driver="driver-a")
        with pytest.raises(UnknownRunPartError, match="shard 5"):
            store.append(run, 5, epoch, [], driver="driver-a")

    def test_driver_facts_on_sealed_grains_change_nothing(self, store: LineageStore, run: str,
                                                          epoch: int) -> None:
        store.append(run, 0, epoch, [GrainDispatched("ocr", (0, 0), 0),
                                     GrainDispatched("ocr", (0, 1), 0)], driver="driver-a")
        assert store.commit(run, [committed("ocr", (0, 0))]) == [CommitVerdict.ACCEPTED]
        store.append(run, 0, epoch, [GrainFailed("ocr", (0, 1), 0, "gave up")], driver="driver-a")
        before = store.read(run, 0)
        with pytest.raises(GrainSealedError) as err:
            store.append(run, 0, epoch, [
                SourceAdmitted(1, ("b",)),
                GrainRetried("ocr", (0, 0), 1, "actor died"),
                GrainDispatched("ocr", (0, 2), 0),
                GrainDispatched("ocr", (0, 1), 1),
            ], driver="driver-a")
        assert err.value.grains == (("ocr", (0, 0)), ("ocr", (0, 1)))
        assert "ocr[0.0], ocr[0.1] already sealed" in str(err.value)
        assert store.read(run, 0) == before
        assert store.grain_phase(run, 0, "ocr", (0, 2)) is None
        # a fact sealing a Grain earlier in the same call counts too
        with pytest.raises(GrainSealedError):
            store.append(run, 0, epoch, [GrainFailed("ocr", (0, 2), 0, "x"),
                                         GrainDispatched("ocr", (0, 2), 1)], driver="driver-a")

    def test_an_append_built_on_facts_the_store_no_longer_holds_is_refused(
            self, store: LineageStore, run: str, epoch: int) -> None:
        """The basis check (what a rollback breaks): the facts the driver read, its latest
        append, the commits it folded since. A refusal writes nothing."""
        seqs = store.append(run, 0, epoch, [GrainDispatched("ocr", (0, 0), 0),
                                            GrainDispatched("ocr", (0, 1), 0)],
                            driver="driver-a", basis=AppendBasis(read_seq=1))
        assert store.commit(run, [committed("ocr", (0, 0))]) == [CommitVerdict.ACCEPTED]
        before = store.read(run, 0)
        more = [SourceAdmitted(1, ("b",))]
        refusals = [
            (AppendBasis(read_seq=before[-1].seq + 2),
             f"it holds facts up to seq {before[-1].seq}, and the driver had read up to "
             f"{before[-1].seq + 2}"),
            (AppendBasis(1, seqs[0] + 1),
             f"the driver's latest append, from seq {seqs[0] + 1}, is gone (the store's latest "
             f"starts at seq {seqs[0]})"),
            (AppendBasis(1, seqs[0], (("ocr", (0, 0), 0), ("ocr", (0, 1), 0))),
             "it no longer holds the accepted commit of ocr[0.1] generation 0"),
            (AppendBasis(1, seqs[0], (("ocr", (0, 0), 1),)),
             "it no longer holds the accepted commit of ocr[0.0] generation 1"),
        ]
        for basis, why in refusals:
            with pytest.raises(StoreRolledBackError, match="went back") as err:
                store.append(run, 0, epoch, more, driver="driver-a", basis=basis)
            assert (err.value.run_id, err.value.shard, err.value.detail) == (run, 0, why)
            assert pickle.loads(pickle.dumps(err.value)).detail == why
        assert store.read(run, 0) == before  # nothing written
        store.append(run, 0, epoch, more, driver="driver-a",
                     basis=AppendBasis(before[-1].seq, seqs[0], (("ocr", (0, 0), 0),)))

    def test_grain_reused_seals_its_grain(self, store: LineageStore, run: str,
                                          epoch: int) -> None:
        """A driver's GrainReused seals the Grain: a report for it is then SEALED, another
        driver fact about it is refused, and it reads back as written."""
        reused = GrainReused("ocr", (0, 0), 0, "k" * 32, "earlier", "ocr", (3, 1), ("v",))
        store.append(run, 0, epoch, [reused], driver="driver-a")
        assert store.grain_phase(run, 0, "ocr", (0, 0)) == (GrainPhase.SEALED, 0)
        assert store.commit(run, [committed("ocr", (0, 0))]) == [CommitVerdict.SEALED]
        with pytest.raises(GrainSealedError):
            store.append(run, 0, epoch, [GrainDispatched("ocr", (0, 0), 0)], driver="driver-a")
        with pytest.raises(GrainSealedError):
            store.append(run, 0, epoch, [reused], driver="driver-a")
        assert [s.fact for s in store.read(run, 0)][-1] == reused

    # -- commit gate -------------------------------------------------------------
    def test_commit_rule_verdicts(self, store: LineageStore, run: str, epoch: int) -> None:
        store.append(run, 0, epoch, [
            GrainDispatched("ocr", (0, 0), 0),
            GrainDispatched("ocr", (0, 1), 0),
            GrainRetried("ocr", (0, 1), 1, "crash"),
            GrainDispatched("ocr", (0, 1), 1),
            GrainDispatched("ocr", (0, 2), 0),
            GrainRetried("ocr", (0, 2), 1, "crash"),
        ], driver="driver-a")
        verdicts = store.commit(run, [
            committed("ocr", (0, 0)),           # accepted
            committed("ocr", (0, 0)),           # duplicate in the same batch
            committed("ocr", (0, 1), 0),        # stale generation
            committed("ocr", (0, 2), 1),        # ready, not in flight
            committed("ocr", (0, 3), 0),        # never dispatched
        ])
        assert verdicts == [CommitVerdict.ACCEPTED, CommitVerdict.SEALED, CommitVerdict.STALE,
                            CommitVerdict.NOT_DISPATCHED, CommitVerdict.NOT_DISPATCHED]
        assert store.commit(run, [committed("ocr", (0, 1), 1)]) == [CommitVerdict.ACCEPTED]
        assert store.commit(run, [committed("ocr", (0, 1), 1)]) == [CommitVerdict.SEALED]
        assert store.grain_phase(run, 0, "ocr", (0, 1)) == (GrainPhase.SEALED, 1)
        assert store.grain_phase(run, 0, "ocr", (0, 2)) == (GrainPhase.READY, 1)
        commits = [s.fact for s in store.read(run, 0) if isinstance(s.fact, GrainCommitted)]
        assert [(c.path, c.generation) for c in commits] == [((0, 0), 0), ((0, 1), 1)]

    def test_group_failure_installs_barrier_atomically(self, store: LineageStore, run: str,
                                                       epoch: int) -> None:
        store.append(run, 0, epoch, [GrainDispatched("ocr", (0, i), 0) for i in range(4)]
                     + [GrainDispatched("ocr", (1, 0), 0), GrainDispatched("render", (0,), 0)],
                     driver="driver-a")
        assert store.commit(run, [committed("ocr", (0, 0))]) == [CommitVerdict.ACCEPTED]
        verdicts = store.commit(run, [
            committed("ocr", (0, 1), outcome=REPORT_RECORD_FAILURE),
            committed("ocr", (0, 2), outcome=REPORT_GROUP_FAILURE),
            committed("ocr", (0, 3)),           # sibling after the barrier: barred
            committed("ocr", (1, 0)),           # another parent: untouched
            committed("render", (0,), outcome=REPORT_GROUP_FAILURE),  # root: own Grain only
        ])
        assert verdicts == [CommitVerdict.ACCEPTED, CommitVerdict.ACCEPTED, CommitVerdict.BARRED,
                            CommitVerdict.ACCEPTED, CommitVerdict.ACCEPTED]
        assert store.barriers(run, 0) == frozenset({("ocr", (0,))})
        tail = [s.fact for s in store.read(run, 0)][-5:]
        assert isinstance(tail[1], GrainCommitted) and tail[1].path == (0, 2)
        assert tail[2] == BarrierInstalled("ocr", (0,), "boom")
        assert store.grain_phase(run, 0, "ocr", (0, 3)) == (GrainPhase.IN_FLIGHT, 0)
        assert store.commit(run, [committed("ocr", (0, 3))]) == [CommitVerdict.BARRED]

    def test_commit_batch_across_shards_keeps_report_order(self, store: LineageStore, run: str
                                                           ) -> None:
        e0 = store.acquire_lease(run, 0, "d", ttl_s=60)
        e1 = store.acquire_lease(run, 1, "d", ttl_s=60)
        store.append(run, 0, e0, [GrainDispatched("ocr", (0, 0), 0)], driver="d")
        store.append(run, 1, e1, [GrainDispatched("ocr", (2, 0), 0)], driver="d")
        verdicts = store.commit(run, [committed("ocr", (2, 0), 1), committed("ocr", (0, 0)),
                                      committed("ocr", (2, 0)), committed("ocr", (3, 0))])
        assert verdicts == [CommitVerdict.STALE, CommitVerdict.ACCEPTED, CommitVerdict.ACCEPTED,
                            CommitVerdict.NOT_DISPATCHED]
        assert [getattr(s.fact, "path", None) for s in store.read(run, 1, domain="root/0")] == [
            (2, 0), (2, 0)]

    def test_large_commit_batches_keep_the_rule(self, store: LineageStore, run: str) -> None:
        # Over the commit script's 1,000-field chunks, across both shards: every verdict and
        # every written fact must be what the rule gives for the same reports one by one.
        e0 = store.acquire_lease(run, 0, "d", ttl_s=60)
        e1 = store.acquire_lease(run, 1, "d", ttl_s=60)
        parents = {0: [0, 1], 1: [2, 3]}  # shard -> source indexes (micro_batch=2)
        for shard, epoch in ((0, e0), (1, e1)):
            store.append(run, shard, epoch, [
                GrainDispatched("ocr", (p, i), 0) for p in parents[shard] for i in range(900)
            ], driver="d")
        reports, expected = [], []
        for p in (0, 1, 2, 3):
            for i in range(900):
                if i % 7 == 3:
                    reports.append(committed("ocr", (p, i), 1))  # stale generation
                    expected.append(CommitVerdict.STALE)
                else:
                    reports.append(committed("ocr", (p, i)))
                    expected.append(CommitVerdict.ACCEPTED)
                if i % 11 == 0:
                    reports.append(committed("ocr", (p, i)))  # duplicate in the batch
                    expected.append(CommitVerdict.SEALED if i % 7 != 3
                                    else CommitVerdict.ACCEPTED)
        reports.append(committed("ocr", (1, 950)))  # never dispatched
        expected.append(CommitVerdict.NOT_DISPATCHED)
        assert store.commit(run, reports) == expected
        accepted = sum(v is CommitVerdict.ACCEPTED for v in expected)
        written = [s.fact for k in (0, 1) for s in store.iter_facts(run, k)
                   if isinstance(s.fact, GrainCommitted)]
        assert len(written) == accepted
        assert store.grain_phase(run, 1, "ocr", (3, 898)) == (GrainPhase.SEALED, 0)
        assert store.grain_phase(run, 1, "ocr", (3, 899)) == (GrainPhase.IN_FLIGHT, 0)  # stale

    def test_commit_takes_reports_only(self, store: LineageStore, run: str) -> None:
        with pytest.raises(FactNotAllowedError):
            store.commit(run, [GrainDispatched("ocr", (0, 0), 0)])  # type: ignore[list-item]
        with pytest.raises(FactNotAllowedError, match="outcome"):
            store.commit(run, [GrainCommitted("ocr", (0, 0), 0, "great")])

    # -- whole runs, pickling ------------------------------------------------------
    def test_scripted_run_and_pickled_store_agree(self, store: LineageStore) -> None:
        written = write_scripted_run(store, "scripted")
        rejected = [(r.path, v) for r, v in written.verdicts if not v.accepted]
        assert ((3, 0), CommitVerdict.STALE) in rejected
        assert ((3, 1), CommitVerdict.BARRED) in rejected
        clone = pickle.loads(pickle.dumps(store))
        assert clone.read_run("scripted") == store.read_run("scripted")


class TestContentClaims:
    """The dedup index (``ContentClaims``): the first claim of a content key wins, all or
    none, and a retried claimant finds its own claim."""

    def test_first_claim_wins_and_a_retry_finds_its_own(self, store: LineageStore) -> None:
        scope = f"scope-{uuid.uuid4().hex[:8]}"
        assert store.claim(scope, ["h1", "h2"], "a.pdf") == ("a.pdf", "a.pdf")
        assert store.claim(scope, ["h1", "h2"], "a.pdf") == ("a.pdf", "a.pdf")  # a retry
        assert store.claim(scope, ["h2", "h3"], "b.pdf") == ("a.pdf", None)     # nothing taken
        assert store.holders(scope, ["h3", "h1"]) == (None, "a.pdf")
        assert store.claim(scope, ["h3"], "c.pdf") == ("c.pdf",)
        assert store.claims_of(scope) == {"h1": "a.pdf", "h2": "a.pdf", "h3": "c.pdf"}
        assert store.holders(f"{scope}-other", ["h1"]) == (None,)  # scopes are apart
        store.delete_claims(scope)
        assert store.claims_of(scope) == {}

    def test_racing_claimants_agree_on_one_holder(self, store: LineageStore) -> None:
        scope = f"scope-{uuid.uuid4().hex[:8]}"
        answers: dict[str, tuple[str | None, ...]] = {}

        def claim(name: str) -> None:
            answers[name] = store.claim(scope, ["k1", "k2", f"own-{name}"], name)

        threads = [threading.Thread(target=claim, args=(f"d{i}",)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, a in answers.items() if a[0] == n]
        assert len(winners) == 1
        assert all(a[:2] == (winners[0], winners[0]) for a in answers.values())
        assert set(store.claims_of(scope).values()) == {winners[0]}  # losers took nothing

    def test_bad_claims_are_refused_before_any_write(self, store: LineageStore) -> None:
        from rayorch.store.claims import ClaimError

        for scope, keys, claimant in [("bad scope", ["k"], "a"), ("s", [], "a"),
                                      ("s", ["k"], ""), ("s", ["k", "x" * 600], "a")]:
            with pytest.raises(ClaimError):
                store.claim(scope, keys, claimant)
        assert store.claims_of("s") == {}
