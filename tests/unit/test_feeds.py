"""Feeds: sources read by a driver are never lost when a shard is rebuilt from the store."""

from __future__ import annotations

from collections.abc import Iterator

from rayorch.core.machine import OutputReady
from rayorch.runtime.delivery import CallerSink, IteratorFeed, ManifestFeed
from rayorch.store.base import RunInfo


def info(shards: int = 1, micro_batch: int = 2) -> RunInfo:
    return RunInfo("run", "fp", {}, shards, micro_batch, {}, 0.0)


def test_rows_offered_again_survive_a_second_rebuild() -> None:
    """Regression (found by tests/property/test_driver_machine.py): two store outages in a
    row lost every source of a generator input, and the run 'completed' with none."""
    feed = IteratorFeed(iter([("a",), ("b",), ("c",)]), info(), 3)
    assert feed.take(0, 2) == [(0, ("a",), None), (1, ("b",), None)]
    feed.reset(0, admitted=set())  # the store never got them
    assert feed.take(0, 2) == [(0, ("a",), None), (1, ("b",), None)]
    feed.reset(0, admitted=set())  # and not the second time either
    assert not feed.exhausted(0)
    assert feed.take(0, 2) == [(0, ("a",), None), (1, ("b",), None)]
    assert feed.take(0, 2) == [(2, ("c",), None)]
    feed.reset(0, admitted={0, 1})  # c never reached the store: offered again
    assert feed.take(0, 2) == [(2, ("c",), None)]
    assert feed.exhausted(0)


def test_a_row_is_kept_until_its_delivery_is_stored() -> None:
    """Regression (found by the fault soak): a store that went back forgot admissions it had
    acknowledged, the feed had let the rows go, and the run completed without them."""
    feed = IteratorFeed(iter([("a",), ("b",), ("c",)]), info(), 3)
    assert feed.take(0, 2) == [(0, ("a",), None), (1, ("b",), None)]
    assert feed.take(0, 2) == [(2, ("c",), None)]
    assert feed.exhausted(0)
    feed.delivered(0, [1])  # b's OutputEmitted is stored: b may go
    feed.reset(0, admitted={2})  # the store went back: it holds c's admission only
    assert not feed.exhausted(0)
    assert feed.take(0, 8) == [(0, ("a",), None)]
    feed.reset(0, admitted={0, 2})
    assert feed.exhausted(0)


def test_iterator_feed_keeps_shards_to_their_micro_batches() -> None:
    feed = IteratorFeed(iter([(i,) for i in range(5)]), info(shards=2), None)
    assert feed.take(1, 8) == []  # source 0 belongs to shard 0
    assert feed.take(0, 8) == [(0, (0,), None), (1, (1,), None)]
    assert feed.take(0, 8) == []
    assert feed.take(1, 8) == [(2, (2,), None), (3, (3,), None)]
    assert feed.take(0, 8) == [(4, (4,), None)]
    assert feed.exhausted(0) and feed.exhausted(1)


def test_an_admission_order_keeps_each_source_at_its_input_position() -> None:
    """Largest files first, or the sources ``--resume`` left: positions keep their index."""
    feed = IteratorFeed(iter([(c,) for c in "abcde"]), info(micro_batch=2), 5, order=[4, 0, 2])
    assert feed.total == 3
    # a micro-batch's worth at a time
    assert feed.take(0, 8) == [(4, ("e",), None), (0, ("a",), None)]
    assert feed.take(0, 8) == [(2, ("c",), None)]
    assert feed.exhausted(0)
    sink = CallerSink(ordered=True, indexes=[4, 0, 2])
    for index in (4, 2, 0):
        sink.offer(0, OutputReady(index, None, "present"))
    assert [ready.index for _, ready in sink.take()] == [0, 2, 4]  # in input order


def test_manifest_feed_offers_what_the_store_lacks() -> None:
    feed = ManifestFeed([(i,) for i in range(6)], info(shards=2))
    feed.reset(0, admitted={0})
    assert feed.shard_total(0) == 4  # micro-batches 0 and 2: sources 0, 1, 4, 5
    assert [i for i, _, _ in feed.take(0, 10)] == [1, 4, 5]
    assert feed.exhausted(0)


def test_an_indexed_feed_admits_ids_as_given_and_reads_them_lazily() -> None:
    """A streamed listing (``Pipeline.run(indexed=...)``): each source keeps the id it was
    given, in the order given, and the feed pulls no more than admission asks for."""
    pulled: list[int] = []

    def listing() -> Iterator[tuple[int, tuple[str]]]:
        for index in (2, 0, 1, 5, 3, 4):  # largest first within a window
            pulled.append(index)
            yield index, (f"s{index}",)

    feed = IteratorFeed.indexed(listing(), info(micro_batch=2))
    assert feed.total is None
    assert feed.take(0, 2) == [(2, ("s2",)), (0, ("s0",))]
    assert pulled == [2, 0]  # no more than asked for
    feed.reset(0, admitted={2})  # the store lost 0's admission: offered again, same id
    assert feed.take(0, 2) == [(0, ("s0",))]
    assert feed.take(0, 8) == [(1, ("s1",)), (5, ("s5",))]
    assert feed.take(0, 8) == [(3, ("s3",)), (4, ("s4",))]
    assert feed.exhausted(0)


def test_run_indexed_refuses_other_inputs_and_ordered_output() -> None:
    import pytest

    import rayorch as ro
    from rayorch.driver import DriverError

    class Echo(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            self.echo = ro.RayModule(str)

        def forward(self, xs: object) -> object:
            return self.echo(xs)

    with pytest.raises(DriverError, match="needs ordered=False"):
        Echo().run(indexed=iter([(0, ("a",))]))
    with pytest.raises(DriverError, match="pass no other inputs"):
        Echo().run(["a"], indexed=iter([(0, ("a",))]), ordered=False)
