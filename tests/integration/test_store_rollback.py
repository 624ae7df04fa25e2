"""Leases across a Redis restore from an older RDB snapshot (or an async replica promoted).

A restore forgets every lease acquired after the snapshot, so the epoch counter goes
back and two drivers can end up with the same epoch number. The fence must still let
only the current holder write (docs/ARCHITECTURE.md, "Leases, holder tokens and rollback").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis

from rayorch.core.facts import LeaseAcquired, SourceAdmitted
from rayorch.store import FencedError, LeaseRolledBackError, LineageStore, open_store
from rayorch.store.scripted_run import scripted_plan
from rayorch.testing import RedisServer

pytestmark = pytest.mark.integration

RUN = "rollback"


def snapshot(server: RedisServer, to: Path) -> None:
    """SAVE an RDB snapshot now and keep a copy of it."""
    redis.Redis.from_url(server.url).save()
    shutil.copy(server.workdir / "dump.rdb", to)


def restore(server: RedisServer, snap: Path) -> None:
    """Crash the server and bring it back from the older snapshot."""
    server.kill()
    shutil.copy(snap, server.workdir / "dump.rdb")
    server.start()


def admitted(store: LineageStore) -> list[SourceAdmitted]:
    return [s.fact for s in store.read(RUN, 0) if isinstance(s.fact, SourceAdmitted)]


@pytest.fixture
def stores(redis_server: RedisServer) -> tuple[LineageStore, LineageStore]:
    """Two clients of one server, as two driver processes would have."""
    first, second = (open_store(redis_server.url + "?retries=20") for _ in range(2))
    first.open_run(RUN, scripted_plan())
    epoch = first.acquire_lease(RUN, 0, "driver-x", ttl_s=60)
    first.release_lease(RUN, 0, "driver-x", epoch)
    return first, second


@pytest.mark.parametrize("second_driver", ["driver-b", "driver-a"])
def test_two_holders_of_one_epoch_number_only_the_current_one_writes(
    redis_server: RedisServer, stores: tuple[LineageStore, LineageStore], tmp_path: Path,
    second_driver: str,
) -> None:
    # driver-b is another driver; driver-a again is a second process reusing the same
    # driver id (e.g. `rayorch driver --driver-id`): only the holder token tells them apart.
    store_a, store_b = stores
    snap = tmp_path / "old.rdb"
    snapshot(redis_server, snap)                      # epoch counter 1
    epoch_a = store_a.acquire_lease(RUN, 0, "driver-a", ttl_s=60)
    store_a.append(RUN, 0, epoch_a, [SourceAdmitted(0, ("a-before",))], driver="driver-a")
    restore(redis_server, snap)                       # driver-a's lease is forgotten
    epoch_b = store_b.acquire_lease(RUN, 0, second_driver, ttl_s=60)
    assert epoch_b == epoch_a == 2                    # the same epoch number, twice
    store_b.append(RUN, 0, epoch_b, [SourceAdmitted(0, ("b",))], driver=second_driver)
    lost = f"continued by driver '{second_driver}' \\(epoch 2\\)"
    with pytest.raises(FencedError, match=lost):
        store_a.append(RUN, 0, epoch_a, [SourceAdmitted(1, ("a-after",))], driver="driver-a")
    with pytest.raises(FencedError, match=lost):
        store_a.renew_lease(RUN, 0, "driver-a", epoch_a, ttl_s=60)
    with pytest.raises(FencedError, match=lost):
        store_a.acquire_lease(RUN, 0, "driver-a", ttl_s=60, after_epoch=epoch_a)
    store_b.append(RUN, 0, epoch_b, [SourceAdmitted(1, ("b",))], driver=second_driver)
    assert admitted(store_b) == [SourceAdmitted(0, ("b",)), SourceAdmitted(1, ("b",))]
    assert store_b.lease_holder(RUN, 0) == (second_driver, epoch_b)


def test_a_driver_returning_after_a_restore_is_told_and_raises_the_epoch(
    redis_server: RedisServer, stores: tuple[LineageStore, LineageStore], tmp_path: Path,
) -> None:
    store_a, store_b = stores
    snap = tmp_path / "old.rdb"
    snapshot(redis_server, snap)
    epoch_a = store_a.acquire_lease(RUN, 0, "driver-a", ttl_s=60)
    restore(redis_server, snap)
    with pytest.raises(LeaseRolledBackError, match="has no record of this driver's epoch 2 "
                                                   "\\(its last lease is epoch 1 by driver "
                                                   "'driver-x'\\)"):
        store_a.append(RUN, 0, epoch_a, [SourceAdmitted(0, ("a",))], driver="driver-a")
    # once a driver has shown its epoch, a new holder numbers above it
    assert store_b.acquire_lease(RUN, 0, "driver-b", ttl_s=60) == epoch_a + 1
    leases = [s.fact for s in store_b.read(RUN, 0) if isinstance(s.fact, LeaseAcquired)]
    assert [(f.driver, f.epoch) for f in leases] == [("driver-x", 1), ("driver-b", 3)]
    assert admitted(store_b) == []


def test_two_clients_with_one_driver_id_only_the_later_acquirer_writes(
    stores: tuple[LineageStore, LineageStore],
) -> None:
    first, second = stores
    epoch = first.acquire_lease(RUN, 0, "driver-a", ttl_s=60)
    assert second.acquire_lease(RUN, 0, "driver-a", ttl_s=60) == epoch  # same id: same epoch
    with pytest.raises(FencedError, match=f"continued by driver 'driver-a' \\(epoch {epoch}\\)"):
        first.append(RUN, 0, epoch, [SourceAdmitted(0, ("first",))], driver="driver-a")
    second.append(RUN, 0, epoch, [SourceAdmitted(0, ("second",))], driver="driver-a")
    assert admitted(second) == [SourceAdmitted(0, ("second",))]
