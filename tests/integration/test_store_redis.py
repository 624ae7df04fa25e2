"""Redis-only behaviour: payload files, script reloads, errors, reconnecting after a restart."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis

from rayorch.core.commit import CommitVerdict
from rayorch.core.facts import REPORT_PRESENT, GrainCommitted, GrainDispatched, SourceAdmitted
from rayorch.store import StoreAuthError, StoreUnavailableError, open_store
from rayorch.store.keys import ShardKeys
from rayorch.store.redis_store import RedisStore
from rayorch.store.retention import apply_gc, plan_gc
from rayorch.store.scripted_run import scripted_plan
from rayorch.testing import RedisServer, free_port

pytestmark = pytest.mark.integration


def big_report(path: tuple[int, ...], gen: int, size: int = 100_000) -> GrainCommitted:
    return GrainCommitted("ocr", path, gen, REPORT_PRESENT, (b"x" * size, "tail"))


def payload_objects(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and not p.name.startswith("."))


def test_outputs_larger_than_a_reference_go_to_one_segment_per_batch(
        redis_url: str, tmp_path: Path) -> None:
    """By default a fact holds a value only up to 128 bytes; larger ones of one commit call
    share one segment object; a rejected report's value does not keep its segment alive."""
    payload_dir = tmp_path / "payloads"
    store = RedisStore(f"{redis_url}?payload_dir={payload_dir}")
    assert store.payloads.threshold == 128
    store.open_run("r", scripted_plan())
    epoch = store.acquire_lease("r", 0, "d", ttl_s=60)
    store.append("r", 0, epoch, [GrainDispatched("ocr", (0, i), 0) for i in range(3)],
                 driver="d")
    verdicts = store.commit("r", [big_report((0, 0), 0), big_report((0, 1), 0, size=200),
                                  GrainCommitted("ocr", (0, 2), 0, REPORT_PRESENT, ("small",))])
    assert verdicts == [CommitVerdict.ACCEPTED] * 3
    [segment] = payload_objects(payload_dir)  # one PUT for the batch's two large values
    raw = [s.fact for s in store.read("r", 0, payloads=False) if isinstance(s.fact, GrainCommitted)]
    assert [f.outputs for f in raw] == [None, None, ("small",)]
    assert [f.payload_ref.partition("@")[0] for f in raw[:2] if f.payload_ref] == [segment] * 2
    loaded = [s.fact for s in store.read("r", 0) if isinstance(s.fact, GrainCommitted)]
    assert [f.outputs for f in loaded] == [(b"x" * 100_000, "tail"), (b"x" * 200, "tail"),
                                           ("small",)]
    # a report of a Grain sealed at another generation: its segment goes at once
    assert store.commit("r", [big_report((0, 1), 5)]) == [CommitVerdict.SEALED]
    assert payload_objects(payload_dir) == [segment]
    # an object left by an actor that died before committing is collected
    orphan = payload_dir / "r" / "ocr" / "dead.seg"
    orphan.write_bytes(b"\x90")
    plan = plan_gc(store, min_orphan_age_s=0)  # what `rayorch gc` removes
    assert plan.orphans == ["r/ocr/dead.seg"]
    apply_gc(store, plan)
    assert payload_objects(payload_dir) == [segment]
    store.delete_run("r")
    assert payload_objects(payload_dir) == []


def test_scripts_are_reloaded_after_the_server_forgets_them(redis_url: str) -> None:
    store = open_store(redis_url)
    store.open_run("r", scripted_plan())
    epoch = store.acquire_lease("r", 0, "d", ttl_s=60)
    redis.Redis.from_url(redis_url).script_flush()
    store.append("r", 0, epoch, [GrainDispatched("ocr", (0, 0), 0)], driver="d")
    redis.Redis.from_url(redis_url).script_flush()
    assert store.commit("r", [GrainCommitted("ocr", (0, 0), 0, REPORT_PRESENT, (1,))]) == [
        CommitVerdict.ACCEPTED]


def test_keys_of_a_shard_share_one_hash_tag(redis_url: str) -> None:
    store = open_store(redis_url)
    store.open_run("r", scripted_plan(), shards=2)
    store.acquire_lease("r", 1, "d", ttl_s=60)
    client = redis.Redis.from_url(redis_url)
    keys = sorted(k.decode() for k in client.keys("ro:{r:1}:*"))  # type: ignore[union-attr]
    assert keys == sorted([ShardKeys("r", 1).lease, ShardKeys("r", 1).holder,
                           ShardKeys("r", 1).epoch,
                           ShardKeys("r", 1).seq, ShardKeys("r", 1).facts("root")])


def test_unreachable_server_is_a_plain_error_without_the_password() -> None:
    url = f"redis://alice:s3cret@127.0.0.1:{free_port()}/0?retries=1"
    with pytest.raises(StoreUnavailableError) as err:
        open_store(url).list_runs()
    text = str(err.value)
    assert "cannot reach the lineage store at redis://alice:***@127.0.0.1" in text
    assert "s3cret" not in text


def test_wrong_or_missing_password_is_an_auth_error(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, password="right")
    server.start()
    try:
        assert open_store(server.url).list_runs() == []
        wrong = server.url.replace(":right@", ":wrong@")
        with pytest.raises(StoreAuthError, match="refused the login") as err:
            open_store(wrong).list_runs()
        assert "wrong" not in str(err.value)
        with pytest.raises(StoreAuthError):
            open_store(f"redis://127.0.0.1:{server.port}/0").list_runs()
    finally:
        server.stop()


def test_store_reconnects_after_a_redis_restart_with_aof(redis_aof_server: RedisServer) -> None:
    store = open_store(redis_aof_server.url + "?retries=30")
    store.open_run("r", scripted_plan())
    epoch = store.acquire_lease("r", 0, "d", ttl_s=60)
    store.append("r", 0, epoch, [SourceAdmitted(0, ("a",)), GrainDispatched("ocr", (0, 0), 0)],
                 driver="d")
    before = store.read("r", 0)
    redis_aof_server.kill()
    restart = threading.Timer(0.5, redis_aof_server.start)
    restart.start()
    try:
        started = time.monotonic()
        verdicts = store.commit("r", [GrainCommitted("ocr", (0, 0), 0, REPORT_PRESENT, (1,))])
    finally:
        restart.join()
    assert time.monotonic() - started >= 0.4
    assert verdicts == [CommitVerdict.ACCEPTED]
    after = store.read("r", 0)
    assert after[: len(before)] == before and len(after) == len(before) + 1
    # the epoch survived the restart: a new holder gets a larger one
    store.release_lease("r", 0, "d", epoch)
    assert store.acquire_lease("r", 0, "other", ttl_s=60) == epoch + 1
