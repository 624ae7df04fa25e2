"""A commit whose reply is lost: the payload segments of what was committed must stay readable.

A proxy between the store client and a real redis-server forwards the commit request
and drops its reply (closes the connection). The commit happened; the client only
sees a connection error (docs/topics/PAYLOADS.md, "Payload segments and uncertain commits").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from rayorch.core.commit import CommitVerdict, GrainPhase
from rayorch.core.facts import REPORT_PRESENT, GrainCommitted, GrainDispatched, GrainRetried
from rayorch.inspect.audit import audit_run
from rayorch.store import LineageStore, StoreUnavailableError, open_store
from rayorch.store.payload import object_of
from rayorch.store.scripted_run import scripted_plan
from rayorch.store.scripts import COMMIT_BATCH
from rayorch.testing import RedisServer, ReplyDroppingProxy

pytestmark = pytest.mark.integration

RUN = "lost-reply"
BIG = (b"x" * 100_000, "tail")


def big(path: tuple[int, ...], gen: int = 0) -> GrainCommitted:
    return GrainCommitted("ocr", path, gen, REPORT_PRESENT, BIG)


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[ReplyDroppingProxy]:
    with ReplyDroppingProxy(redis_server.port) as proxy:
        yield proxy


@pytest.fixture
def direct(redis_server: RedisServer, tmp_path: Path) -> Iterator[LineageStore]:
    """The driver's store, straight to the server: it dispatched ocr[0.0] and ocr[0.1]."""
    store = open_store(f"{redis_server.url}?payload_dir={tmp_path / 'payloads'}")
    store.open_run(RUN, scripted_plan())
    epoch = store.acquire_lease(RUN, 0, "d", ttl_s=60)
    store.append(RUN, 0, epoch, [GrainDispatched("ocr", (0, 0), 0),
                                 GrainDispatched("ocr", (0, 1), 0)], driver="d")
    redis.Redis.from_url(redis_server.url).script_load(COMMIT_BATCH.source)  # as after a commit
    yield store
    store.close()


def worker_store(proxy: ReplyDroppingProxy, tmp_path: Path, retries: int) -> LineageStore:
    """A worker's store, through the proxy."""
    return open_store(f"redis://127.0.0.1:{proxy.port}/0?retries={retries}"
                      f"&payload_dir={tmp_path / 'payloads'}")


def payload_files(tmp_path: Path) -> list[Path]:
    """The payload segments written (owner marks left out)."""
    return sorted((tmp_path / "payloads").rglob("*.seg"))


def committed(store: LineageStore) -> list[GrainCommitted]:
    return [s.fact for s in store.read(RUN, 0) if isinstance(s.fact, GrainCommitted)]


@pytest.mark.parametrize("retry_with_token", [False, True])
def test_a_commit_whose_reply_was_lost_keeps_its_payload(
    direct: LineageStore, proxy: ReplyDroppingProxy, tmp_path: Path, retry_with_token: bool,
) -> None:
    worker = worker_store(proxy, tmp_path, retries=0)
    proxy.drop_next_reply(COMMIT_BATCH.sha.encode())
    with pytest.raises(StoreUnavailableError):
        worker.commit(RUN, [big((0, 0))], token="batch-7")
    assert proxy.dropped == 1
    assert direct.grain_phase(RUN, 0, "ocr", (0, 0)) == (GrainPhase.SEALED, 0)  # it happened
    assert [f.outputs for f in committed(direct)] == [BIG]  # and its payload resolves
    # the worker retries the commit: as a new call (SEALED) or with its token (ACCEPTED)
    verdicts = worker.commit(RUN, [big((0, 0))], token="batch-7" if retry_with_token else None)
    assert verdicts == [CommitVerdict.ACCEPTED if retry_with_token else CommitVerdict.SEALED]
    [fact] = committed(direct)
    assert fact.outputs == BIG
    assert [p.relative_to(tmp_path / "payloads").as_posix() for p in payload_files(tmp_path)] \
        == [object_of(fact.payload_ref or "")]  # one segment: the retry wrote the same object
    assert not [v for v in audit_run(direct, RUN).violations if "payload" in v.message]
    worker.close()


def test_a_reply_lost_inside_the_client_retry_is_replayed(
    direct: LineageStore, proxy: ReplyDroppingProxy, tmp_path: Path,
) -> None:
    worker = worker_store(proxy, tmp_path, retries=3)
    proxy.drop_next_reply(COMMIT_BATCH.sha.encode())
    assert worker.commit(RUN, [big((0, 0))]) == [CommitVerdict.ACCEPTED]  # resent, same token
    assert proxy.dropped == 1
    assert [f.outputs for f in committed(direct)] == [BIG]
    assert len(payload_files(tmp_path)) == 1
    worker.close()


def test_definitely_rejected_payloads_are_deleted_and_shared_ones_kept(
    direct: LineageStore, tmp_path: Path,
) -> None:
    epoch = direct.lease_holder(RUN, 0)
    assert epoch is not None
    # same report twice in one call: the duplicate is SEALED but shares the committed file
    assert direct.commit(RUN, [big((0, 0)), big((0, 0))]) == [CommitVerdict.ACCEPTED,
                                                              CommitVerdict.SEALED]
    assert len(payload_files(tmp_path)) == 1
    # ocr[0.1] goes to generation 1 and commits; late generation-0 reports are rejected
    direct.append(RUN, 0, epoch.epoch, [GrainRetried("ocr", (0, 1), 1, "crash"),
                                        GrainDispatched("ocr", (0, 1), 1)], driver="d")
    late = GrainCommitted("ocr", (0, 1), 0, REPORT_PRESENT, (b"y" * 100_000,))
    assert direct.commit(RUN, [late]) == [CommitVerdict.STALE]
    assert len(payload_files(tmp_path)) == 1
    assert direct.commit(RUN, [big((0, 1), 1)]) == [CommitVerdict.ACCEPTED]
    assert direct.commit(RUN, [late]) == [CommitVerdict.SEALED]  # sealed at generation 1
    assert len(payload_files(tmp_path)) == 2
    assert [f.outputs for f in committed(direct)] == [BIG, BIG]


def test_a_lost_reply_of_a_batch_keeps_its_one_segment_and_every_value_once(
    direct: LineageStore, proxy: ReplyDroppingProxy, tmp_path: Path,
) -> None:
    """Two large values of one batch share one segment; the reply is lost and the worker
    retries as a new call: still one segment, both values resolve once, audit clean."""
    worker = worker_store(proxy, tmp_path, retries=0)
    batch = [big((0, 0)), GrainCommitted("ocr", (0, 1), 0, REPORT_PRESENT, (b"y" * 5000,))]
    proxy.drop_next_reply(COMMIT_BATCH.sha.encode())
    with pytest.raises(StoreUnavailableError):
        worker.commit(RUN, batch)
    assert worker.commit(RUN, batch) == [CommitVerdict.SEALED, CommitVerdict.SEALED]
    assert len(payload_files(tmp_path)) == 1  # kept: the lost call's facts name it
    assert [f.outputs for f in committed(direct)] == [BIG, (b"y" * 5000,)]
    assert len({object_of(f.payload_ref or "") for f in
                (s.fact for s in direct.read(RUN, 0, payloads=False))
                if isinstance(f, GrainCommitted)}) == 1
    assert not [v for v in audit_run(direct, RUN).violations if "payload" in v.message]
    worker.close()
