"""Exactly-once on S3 rests on one call, ``Storage.create``: a conditional PUT
(``If-None-Match: *``) that never replaces an object. These tests hit it on the loopback S3
server directly, then through an ``s3://`` sink whose adopter and discarder race for a part:
exactly one of them wins, and the other sees that it lost."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from s3_tools import keys

from rayorch.core.machine import OutputDelivered
from rayorch.runtime.sink_audit import check_delivery
from rayorch.runtime.sinks import CLAIM_PREFIX, FileSink, read_outputs
from rayorch.storage import open_storage

pytestmark = [pytest.mark.s3, pytest.mark.timeout(300)]

pytest.importorskip("obstore")


def test_create_refuses_an_existing_key_and_keeps_the_first_bytes(
        s3_endpoint: str, bucket: str) -> None:
    storage = open_storage(f"s3://{bucket}/raw")
    assert storage.create("k.bin", b"first")
    assert not storage.create("k.bin", b"second")
    assert storage.read("k.bin") == b"first"
    storage.put("k.bin", b"replaced")  # put is the one call that may replace
    assert not storage.create("k.bin", b"third")
    assert storage.read("k.bin") == b"replaced"
    assert keys(s3_endpoint, bucket, "raw/") == ["raw/k.bin"]


def test_put_file_replaces_a_key_with_a_large_local_file_in_parts(
        s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    """The job's views (a million rows: hundreds of MB) go up from a local file, in parts
    when large; the key holds the file's bytes, whole, after each put."""
    storage = open_storage(f"s3://{bucket}/views")
    storage.put("documents.jsonl", b"old\n")
    big = tmp_path / "rows"
    body = b"".join(b'{"id":%d}\n' % i for i in range(900_000))  # ~12 MB: 3 parts of 5 MB
    big.write_bytes(body)
    storage.put_file("documents.jsonl", big)
    assert storage.read("documents.jsonl") == body
    small = tmp_path / "small"
    small.write_bytes(b"one row\n")
    storage.put_file("documents.jsonl", small)
    assert storage.read("documents.jsonl") == b"one row\n"
    assert keys(s3_endpoint, bucket, "views/") == ["views/documents.jsonl"]


def test_racing_creates_of_one_key_have_one_winner(s3_endpoint: str, bucket: str) -> None:
    storage = open_storage(f"s3://{bucket}/race")
    wins: list[bytes] = []
    start = threading.Barrier(8)

    def contender(body: bytes) -> None:
        start.wait()
        if storage.create("one", body):
            wins.append(body)

    threads = [threading.Thread(target=contender, args=(b"c%d" % i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1, wins
    assert storage.read("one") == wins[0]


def test_an_adopted_part_survives_its_deposed_writers_discard(s3_endpoint: str,
                                                              bucket: str) -> None:
    url = f"s3://{bucket}/out"
    writer = FileSink(url, run_id="r")
    written = writer.write_part(0, [(0, "a"), (1, "b")])  # its append was refused
    heir = FileSink(url, run_id="r")
    adopted = heir.adopt(0, [0, 1])  # the shard's next holder claims it first
    assert sorted(f.index for f in adopted) == [0, 1]
    writer.discard(written)  # lost: the claim marker says adopt, so the part stays
    assert sorted(r["index"] for r in read_outputs(url)) == [0, 1]
    assert check_delivery(url, adopted, complete=True) == []
    claim = open_storage(url).read(CLAIM_PREFIX + written[0].sink.partition(":")[2])
    assert claim.startswith(b"adopt")


def test_a_discarded_part_is_not_adopted(s3_endpoint: str, bucket: str) -> None:
    url = f"s3://{bucket}/out"
    writer = FileSink(url, run_id="r")
    written = writer.write_part(0, [(0, "a")])
    writer.discard(written)  # the discarder claims first: the part goes
    heir = FileSink(url, run_id="r")
    assert heir.adopt(0, [0]) == []  # and the heir writes it anew
    assert list(read_outputs(url)) == []


def race_adopter_and_discarder(url: str, shard: int) -> list[OutputDelivered]:
    """A part whose writer's append was refused; its writer discards it while the shard's
    next holder adopts it, both released at once. What the adopter delivered."""
    writer = FileSink(url, run_id="r")
    written = writer.write_part(shard, [(shard, f"v{shard}")])
    heir = FileSink(url, run_id="r")
    adopted: list[OutputDelivered] = []
    start = threading.Barrier(2)

    def adopt() -> None:
        start.wait()
        adopted.extend(heir.adopt(shard, [shard]))

    def discard() -> None:
        start.wait()
        writer.discard(written)

    threads = [threading.Thread(target=adopt), threading.Thread(target=discard)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return adopted


def test_adopter_and_discarder_racing_for_one_part_have_one_winner(
        s3_endpoint: str, bucket: str) -> None:
    url = f"s3://{bucket}/out"
    for shard in range(6):
        adopted = race_adopter_and_discarder(url, shard)
        present = [r["index"] for r in read_outputs(url) if r["index"] == shard]
        if adopted:  # the adopter won: its part stays, its facts check out
            assert present == [shard]
            assert check_delivery(url, adopted, complete=False) == []
        else:  # the discarder won: the part is gone, the adopter delivered nothing
            assert present == []
