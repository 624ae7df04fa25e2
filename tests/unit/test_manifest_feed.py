"""ManifestFeed: each shard's sources not yet admitted, in index order, nothing per source kept."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rayorch.runtime.delivery import ManifestFeed
from rayorch.store.base import RunInfo, shard_of


@given(total=st.integers(0, 120), shards=st.integers(1, 5), micro=st.integers(1, 9),
       data=st.data(), limit=st.integers(1, 20))
def test_a_shard_gets_its_unadmitted_sources_in_order(
    total: int, shards: int, micro: int, data: st.DataObject, limit: int
) -> None:
    sources = [(f"s{i}",) for i in range(total)]
    identities = [f"id1 size={i} etag=e{i}" for i in range(total)]
    info = RunInfo("r", "f", {}, shards, micro, {}, 0.0)
    feed = ManifestFeed(sources, info, identities)
    for shard in range(shards):
        mine = [i for i in range(total) if shard_of(i, micro, shards) == shard]
        assert feed.shard_total(shard) == len(mine)
        admitted = set(data.draw(st.lists(st.sampled_from(mine), unique=True))) if mine else set()
        assert feed.take(shard, limit) == [] and feed.exhausted(shard)  # before any reset
        feed.reset(shard, admitted)
        got = []
        while not feed.exhausted(shard):
            rows = feed.take(shard, limit)
            assert 0 < len(rows) <= limit
            got.extend(rows)
        assert got == [(i, (f"s{i}",), identities[i]) for i in mine if i not in admitted]
        assert feed.take(shard, limit) == []
