"""Payload segments in a bucket of a real S3-API server on loopback (conftest.py): a commit
call's large values are one object, read back by ranged reads; a commit whose reply is lost
and is retried leaves that one object, every value resolves once and the audit finds no
unresolved reference (docs/topics/PAYLOADS.md, "Payload segments and uncertain commits"); once
their source is delivered the segment leaves the bucket and its facts read as outlines
("Freeing values").
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from s3_tools import keys

from rayorch.core.commit import CommitVerdict
from rayorch.core.facts import FREED, REPORT_PRESENT, GrainCommitted, GrainDispatched, OutputEmitted
from rayorch.inspect.audit import audit_run
from rayorch.store import LineageStore, StoreUnavailableError, open_store
from rayorch.store.payload import object_of
from rayorch.store.scripted_run import scripted_plan
from rayorch.store.scripts import COMMIT_BATCH
from rayorch.testing import RedisServer, ReplyDroppingProxy

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]
pytest.importorskip("obstore")

RUN = "segments"


def values(n: int) -> list[tuple[bytes, str]]:
    return [(bytes([65 + i]) * (1000 + 10 * i), f"page {i}") for i in range(n)]


@pytest.fixture
def direct(redis_server: RedisServer, bucket: str) -> Iterator[LineageStore]:
    """The driver's store: payloads in the bucket; it dispatched ocr[0.0..0.3]."""
    store = open_store(f"{redis_server.url}?payload_dir=s3://{bucket}/payloads")
    store.open_run(RUN, scripted_plan())
    epoch = store.acquire_lease(RUN, 0, "d", ttl_s=60)
    store.append(RUN, 0, epoch, [GrainDispatched("ocr", (0, i), 0) for i in range(4)],
                 driver="d")
    redis.Redis.from_url(redis_server.url).script_load(COMMIT_BATCH.source)
    yield store
    store.close()


def committed(store: LineageStore, *, payloads: bool = True) -> list[GrainCommitted]:
    return [s.fact for s in store.read(RUN, 0, payloads=payloads)
            if isinstance(s.fact, GrainCommitted)]


def segments(endpoint: str, bucket: str) -> list[str]:
    return [k for k in keys(endpoint, bucket, f"payloads/{RUN}/") if k.endswith(".seg")]


def test_a_batch_of_values_is_one_object_read_back_by_ranges(
        direct: LineageStore, s3_endpoint: str, bucket: str) -> None:
    batch = [GrainCommitted("ocr", (0, i), 0, REPORT_PRESENT, v) for i, v in enumerate(values(4))]
    assert direct.commit(RUN, batch) == [CommitVerdict.ACCEPTED] * 4
    [segment] = segments(s3_endpoint, bucket)  # one PUT for four values
    refs = [f.payload_ref or "" for f in committed(direct, payloads=False)]
    assert {f"payloads/{object_of(ref)}" for ref in refs} == {segment}
    assert [f.outputs for f in committed(direct)] == values(4)
    assert not [v for v in audit_run(direct, RUN).violations if "payload" in v.message]


def test_a_lost_reply_leaves_one_segment_on_s3(
        direct: LineageStore, redis_server: RedisServer, s3_endpoint: str, bucket: str) -> None:
    batch = [GrainCommitted("ocr", (0, i), 0, REPORT_PRESENT, v) for i, v in enumerate(values(3))]
    with ReplyDroppingProxy(redis_server.port) as proxy:
        worker = open_store(f"redis://127.0.0.1:{proxy.port}/0?retries=0"
                            f"&payload_dir=s3://{bucket}/payloads")
        proxy.drop_next_reply(COMMIT_BATCH.sha.encode())
        with pytest.raises(StoreUnavailableError):
            worker.commit(RUN, batch, token="batch-1")
        assert proxy.dropped == 1
        # retried as the lost call (its token): the same object, not a second one
        assert worker.commit(RUN, batch, token="batch-1") == [CommitVerdict.ACCEPTED] * 3
        worker.close()
    assert len(segments(s3_endpoint, bucket)) == 1
    assert [f.outputs for f in committed(direct)] == values(3)  # each value once
    assert not [v for v in audit_run(direct, RUN).violations if "payload" in v.message]


def test_a_delivered_sources_segment_leaves_the_bucket_and_reads_as_its_outline(
        direct: LineageStore, s3_endpoint: str, bucket: str) -> None:
    batch = [GrainCommitted("ocr", (0, i), 0, REPORT_PRESENT, v) for i, v in enumerate(values(4))]
    assert direct.commit(RUN, batch) == [CommitVerdict.ACCEPTED] * 4
    assert len(segments(s3_endpoint, bucket)) == 1
    holder = direct.lease_holder(RUN, 0)
    assert holder is not None
    direct.append(RUN, 0, holder.epoch, [OutputEmitted(0, "present")], driver="d")
    assert segments(s3_endpoint, bucket) == []  # ocr is not delivered: freed
    assert [f.outputs for f in committed(direct)] == [(FREED, f"page {i}") for i in range(4)]
    report = audit_run(direct, RUN)
    assert report.counts["payloads"]["freed"] == 4
    assert not [v for v in report.violations if "payload" in v.message]
