"""Store pieces that need no server: sharding, keys, URLs, errors, payload files, leases."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from rayorch.core.errors import RayorchError, StoreError
from rayorch.core.facts import REPORT_PRESENT, GrainCommitted, SourceAdmitted, pack_value
from rayorch.store import (
    FencedError,
    GrainSealedError,
    LeaseHeldError,
    LeaseLostError,
    LeaseRolledBackError,
    PayloadError,
    RunMismatchError,
    RunNotFoundError,
    StoreAuthError,
    StoreUnavailableError,
    StoreURLError,
    StoreVersionError,
    open_store,
    shard_of,
)
from rayorch.store.base import (
    DriverRegistry,
    FactLog,
    Leases,
    LineageStore,
    PoolLog,
    RunRegistry,
)
from rayorch.store.errors import PayloadMissingError, StoreClosedError
from rayorch.store.keys import (
    BY_CHILD,
    BY_SOURCE,
    GrainKeys,
    ShardKeys,
    barrier_member,
    grain_bucket,
    grain_field,
    grain_table_for,
    meta_key,
    valid_run_id,
)
from rayorch.store.memory import MemoryStore
from rayorch.store.payload import PayloadStore, object_of
from rayorch.store.redis_store import RedisStore
from rayorch.store.redis_support import parse_version, redact_url
from rayorch.store.registry import BACKENDS, Backend, is_shared_store
from rayorch.store.scripted_run import scripted_plan


def test_shard_of_groups_micro_batches() -> None:
    assert [shard_of(i, 2, 3) for i in range(8)] == [0, 0, 1, 1, 2, 2, 0, 0]
    assert {shard_of(i, 1, 1) for i in range(10)} == {0}


def test_every_key_of_a_shard_shares_its_hash_tag() -> None:
    keys = ShardKeys("run-1", 3)
    everything = keys.all_keys(("root", "root/0"))
    assert all("{run-1:3}" in k for k in everything)
    assert keys.facts("root/0") == "ro:{run-1:3}:facts:root/0"
    assert meta_key("run-1") == "ro:{run-1}:meta"
    assert grain_field("ocr@1", (4, 0, 2)) == "ocr@1|4.0.2"
    assert barrier_member("ocr", (4, 0)) == "ocr|4.0"
    assert valid_run_id("a_b.c-1") and not valid_run_id("a:b") and not valid_run_id("{x}")


def test_a_grains_bucket_is_its_source_and_first_child_and_names_its_source_exactly() -> None:
    """A page's Grains share a bucket (a source's, in a plan of one expansion level);
    source 1's buckets are never source 12's (a SCAN pattern ``1*`` would match both); a run
    from before buckets has one hash."""
    grains = GrainKeys(ShardKeys("r", 0), BY_CHILD)
    assert [grain_bucket(p) for p in [(12,), (12, 3), (12, 3, 7), (12, 3, 7, 1)]] == \
        ["12", "12.3", "12.3", "12.3"]
    assert grains.of((12, 3, 7)) == "ro:{r:0}:grains:12.3" == grains.of((12, 3))
    assert grains.of((12,)) == "ro:{r:0}:grains:12"
    assert [grains.source_of(grains.of(p)) for p in [(1,), (1, 2), (12,), (12, 1)]] == \
        [1, 1, 12, 12]
    assert grains.source_of("ro:{r:1}:grains:1") is None  # another shard's
    assert grains.source_of("ro:{r:0}:grains") is None
    flat = GrainKeys(ShardKeys("r", 0), BY_SOURCE)
    assert flat.of((12,)) == flat.of((12, 3)) == flat.of((12, 3, 7)) == "ro:{r:0}:grains:12"
    assert flat.source_of(flat.of((12, 3))) == 12
    assert grain_table_for(0) == grain_table_for(1) == BY_SOURCE
    assert grain_table_for(2) == grain_table_for(3) == BY_CHILD
    old = GrainKeys(ShardKeys("r", 0), None)
    assert old.of((12, 3, 7)) == old.of((1,)) == "ro:{r:0}:grains"
    assert old.source_of("ro:{r:0}:grains") is None


def test_urls_are_redacted_and_versions_parsed() -> None:
    assert redact_url("redis://bob:pw@h:6380/1") == "redis://bob:***@h:6380/1"
    assert redact_url("rediss://:pw@h/0") == "rediss://:***@h/0"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"
    assert parse_version("7.0.15") == (7, 0, 15) and parse_version("6.2.6") < (7, 0)


def test_bad_urls_are_plain_errors() -> None:
    with pytest.raises(StoreURLError, match="unknown scheme 'mysql'"):
        open_store("mysql://x")
    with pytest.raises(StoreURLError, match="integers"):
        open_store("redis://h/0?payload_threshold=big")
    with pytest.raises(StoreURLError):
        open_store("memory://a/b")


def test_a_backend_is_a_module_and_its_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "scratch", Backend("scratch", "rayorch.store.memory:MemoryStore",
                                                     shared=False))
    store = open_store("scratch://x")
    assert type(store) is MemoryStore and store.url == "scratch://x"
    assert not is_shared_store("scratch://x") and is_shared_store("rediss+cluster://h:1")
    with pytest.raises(StoreURLError, match="known: memory://, redis"):
        open_store("nope://x")


@pytest.mark.parametrize("interface", [FactLog, Leases, RunRegistry, DriverRegistry, PoolLog])
def test_each_store_interface_is_small(interface: type) -> None:
    methods = [name for name, value in vars(interface).items()
               if callable(value) and not name.startswith("__")]
    assert len(methods) <= 7, f"{interface.__name__}: {methods}"
    assert issubclass(LineageStore, interface)


def test_redis_store_options_stay_out_of_the_redis_url(tmp_path: Path) -> None:
    store = RedisStore(f"redis://u:pw@h:1/2?payload_dir={tmp_path}&payload_threshold=10&retries=3")
    assert store.payloads.root == str(tmp_path) and store.payloads.threshold == 10
    assert store.retries == 3 and store.safe_url.startswith("redis://u:***@h:1/2")
    clone = pickle.loads(pickle.dumps(store))
    assert isinstance(clone, RedisStore) and clone.url == store.url


@pytest.mark.parametrize(
    "error",
    [
        StoreUnavailableError("redis://h:1/0", "refused"),
        StoreAuthError("redis://h:1/0", "WRONGPASS"),
        StoreVersionError("redis://h:1/0", "6.2.0"),
        RunNotFoundError("r", "memory://x"),
        RunMismatchError("r", "plan fingerprint", "aa", "bb"),
        LeaseHeldError("r", 1, "d", 4),
        LeaseLostError("r", 1, 4),
        FencedError("r", 1, 4, 5),
        FencedError("r", 1, 4, 5, "driver-b"),
        LeaseRolledBackError("r", 1, 4, 2, "driver-x"),
        GrainSealedError("r", 0, [("ocr", (1, 2))]),
        PayloadError("r/ocr/x", "missing"),
    ],
)
def test_store_errors_pickle_and_say_what_to_do(error: StoreError) -> None:
    assert isinstance(error, RayorchError)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert len(str(error)) > 40 and "." in str(error)


def test_memory_store_names_are_shared_in_process() -> None:
    a = open_store("memory://shared-unit")
    assert open_store("memory://shared-unit") is a
    assert pickle.loads(pickle.dumps(a)) is a
    assert open_store("memory://") is not open_store("memory://")


def test_a_memory_store_lives_while_someone_has_it_open() -> None:
    url = "memory://lifetime-unit"
    first = open_store(url)
    first.open_run("r", scripted_plan())
    second = open_store(url)
    assert second is first
    first.close()
    assert second.run_info("r").run_id == "r"  # the second user still has it
    second.close()
    with pytest.raises(StoreClosedError, match="closed by its last user"):
        second.run_info("r")
    fresh = open_store(url)
    assert fresh is not first and fresh.list_runs() == []
    fresh.close()
    anonymous = open_store("memory://")
    anonymous.open_run("r", scripted_plan())
    anonymous.close()
    again = open_store(anonymous.url)  # nothing of it is left in the registry
    assert again is not anonymous and again.list_runs() == []
    again.close()
    owned = MemoryStore()  # not from the registry: its owner decides
    owned.open_run("r", scripted_plan())
    owned.close()
    assert owned.run_info("r").run_id == "r"


def test_memory_leases_expire_on_the_store_clock() -> None:
    now = [100.0]
    store = MemoryStore(clock=lambda: now[0])
    store.open_run("r", scripted_plan())
    epoch = store.acquire_lease("r", 0, "a", ttl_s=5)
    now[0] += 4
    store.renew_lease("r", 0, "a", epoch, ttl_s=5)
    now[0] += 4
    with pytest.raises(LeaseHeldError):
        store.acquire_lease("r", 0, "b", ttl_s=5)
    now[0] += 2
    assert store.lease_holder("r", 0) is None
    with pytest.raises(LeaseLostError):
        store.append("r", 0, epoch, [SourceAdmitted(0, ("a",))], driver="a")
    assert store.acquire_lease("r", 0, "b", ttl_s=5) == epoch + 1


def test_payload_segments_round_trip_and_stay_inside_their_directory(tmp_path: Path) -> None:
    """A batch's values go to one segment, read back by ranges; a segment is named by its
    content, so the same batch makes the same object; a damaged byte is caught per value."""
    payloads = PayloadStore(tmp_path, threshold=8)
    reports = [GrainCommitted("ocr", (1, i), 0, REPORT_PRESENT, (bytes([i]) * 100, (i, "two")))
               for i in range(3)]
    slim, refs = payloads.write_segment("run", reports)
    [segment] = {object_of(ref) for ref in refs}  # one object for the batch
    assert segment.startswith("run/ocr/") and segment.endswith(".seg")
    assert all(s.outputs is None and s.payload_ref == ref for s, ref in zip(slim, refs))
    assert all(len(ref) < 100 for ref in refs)  # a reference, not a value
    assert payloads.write_segment("run", reports) == (slim, refs)  # the same batch, object
    assert [payloads.resolve(s).outputs for s in slim] == [r.outputs for r in reports]
    assert payloads.refs("run") == {segment}
    with pytest.raises(PayloadError, match="outside"):
        payloads.load("../../etc/passwd")
    with pytest.raises(PayloadError, match="outside"):
        payloads.load("../x.seg@0+10")
    path = tmp_path / segment
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the last value's last byte
    path.write_bytes(bytes(data))
    assert payloads.load(refs[0]) == reports[0].outputs  # the others still read
    with pytest.raises(PayloadError, match="do not match their digest"):
        payloads.load(refs[2])
    offset, _, length = refs[2].rpartition("@")[2].partition("+")
    with pytest.raises(PayloadError, match="do not match their digest"):
        payloads.load(f"{segment}@{offset}+{int(length) + 50}")  # past the end
    legacy = tmp_path / "run" / "ocr" / "1.2.g0.tok.msgpack"  # an older run's file
    legacy.write_bytes(pack_value(("old",)))
    assert payloads.load("run/ocr/1.2.g0.tok.msgpack") == ("old",)
    legacy.write_bytes(b"\xc1")
    with pytest.raises(PayloadError, match="cannot decode"):
        payloads.load("run/ocr/1.2.g0.tok.msgpack")
    legacy.unlink()
    payloads.delete(refs[1])  # a value's object: the whole segment
    with pytest.raises(PayloadMissingError, match="it is not under"):
        payloads.load(refs[0])
