"""The memory store keeps what a run still needs, not the run (issue 38): once a source is
delivered its values are gone from the store (read back as their outline), its Grains leave
the Grain table, and its facts move into compressed segments; the audit still passes, and
``keep=all`` keeps every value for a run to be reused whole.

Real Ray, a real ``Pipeline.run`` over enough documents that the store moves facts into
segments (more than ``2 * memory_log.BLOCK`` facts)."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest

import rayorch as ro
from rayorch import F
from rayorch.core.commit import CommitVerdict, GrainPhase
from rayorch.core.facts import GrainCommitted, GrainDispatched, GrainReused, outline_of
from rayorch.inspect.audit import audit_run
from rayorch.store.memory_log import BLOCK
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])

DOCS = 700  # x 11 facts: more than 2 * BLOCK, so facts move into segments


def pages(docs: list[int]) -> list[list[str]]:
    return [[f"page {d}.{p} " + "text " * 40 for p in range(2)] for d in docs]


def words(texts: list[str]) -> list[dict[str, Any]]:
    return [{"words": text.split(), "chars": len(text)} for text in texts]


def assemble(docs: list[list[dict[str, Any]]]) -> list[str]:
    return [" ".join(w for page in doc for w in page["words"]) for doc in docs]


class Book(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.render = ro.RayModule(pages, batch_size=64, num_cpus=0.25)
        self.read = ro.RayModule(words, batch_size=64, num_cpus=0.25)
        self.assemble = ro.RayModule(assemble, batch_size=64, num_cpus=0.25)

    def forward(self, docs: ro.Port) -> ro.Port:
        return self.assemble(F.reduce(self.read(F.expand(self.render(docs)))))


def expected(doc: int) -> str:
    return " ".join(w for p in range(2) for w in (f"page {doc}.{p} " + "text " * 40).split())


def commits(store: Any, run_id: str) -> list[GrainCommitted]:
    return [s.fact for facts in store.read_run(run_id).values() for s in facts
            if isinstance(s.fact, GrainCommitted)]


def test_a_delivered_source_leaves_no_value_and_no_grain_in_the_memory_store(
        ray_local: None) -> None:
    url = f"memory://frees-{uuid.uuid4().hex[:8]}"
    store = open_store(url)  # held: the store lives while it is open
    try:
        handle = Book().run(list(range(DOCS)), store=url, quiet=True, progress=False)
        run_id = handle.run_id
        got: dict[int, str] = {}
        for index, value in handle:
            got[index] = value
            if len(got) == DOCS - 100:  # in the run: facts move into segments as it goes
                [places] = store.fact_places(run_id)
                assert places.segments >= 1 and places.live < 2 * BLOCK, places
        assert got == {d: expected(d) for d in range(DOCS)}
        read = commits(store, run_id)
        assert len(read) == DOCS * 4
        # Every value read back is an outline (no value larger than an outline leaf): the
        # store holds none of the pages, words or documents of the delivered sources.
        kept = [(c.call, c.path) for c in read if c.outputs != outline_of(c.outputs or ())]
        assert not kept, f"values kept after delivery: {kept[:5]}"
        # Their Grains left the commit gate's table (as the Redis archive's trim drops them):
        # sealed for good, their generations no longer kept; a late report is refused.
        gone = (GrainPhase.SEALED, -1)
        assert store.grain_phase(run_id, 0, "render", (0,)) == gone
        assert store.grain_phase(run_id, 0, "read", (DOCS - 1, 1)) == gone
        late = GrainCommitted("read", (3, 0), 0, "present", ({"words": []},))
        assert store.commit(run_id, [late]) == [CommitVerdict.SEALED]
        [places] = store.fact_places(run_id)  # a done shard moves whole
        assert places.archived > 2 * BLOCK and places.live < BLOCK
        report = audit_run(store, run_id)
        assert report.ok, [str(v) for v in report.violations]
        assert report.counts["payloads"]["freed"] > 0
    finally:
        store.close()


def test_keep_all_keeps_every_value_and_a_later_run_reuses_them(ray_local: None) -> None:
    url = f"memory://keeps-{uuid.uuid4().hex[:8]}?keep=all"
    store = open_store(url)
    try:
        first = Book().run(list(range(DOCS)), store=url, quiet=True, progress=False)
        assert dict(first) == {d: expected(d) for d in range(DOCS)}
        assert store.run_info(first.run_id).keep == "all"
        documents = {c.path[0]: c.outputs for c in commits(store, first.run_id)
                     if c.call == "assemble"}
        assert documents == {d: (expected(d),) for d in range(DOCS)}
        assert audit_run(store, first.run_id).ok
        again = Book().run(list(range(DOCS)), store=url, quiet=True, progress=False,
                           reuse=first.run_id)
        assert dict(again) == {d: expected(d) for d in range(DOCS)}
        facts = [s.fact for k in store.read_run(again.run_id).values() for s in k]
        assert not [f for f in facts if isinstance(f, GrainDispatched)]
        assert len([f for f in facts if isinstance(f, GrainReused)]) == DOCS * 4
    finally:
        store.close()


def test_a_run_reusing_freed_values_runs_them_again(ray_local: None) -> None:
    """A value freed after delivery is never reused (it reads back as an outline): a later
    run with ``reuse=`` computes it again and delivers the same documents."""
    url = f"memory://rerun-{uuid.uuid4().hex[:8]}"
    store = open_store(url)
    try:
        first = Book().run(list(range(50)), store=url, quiet=True, progress=False)
        assert dict(first) == {d: expected(d) for d in range(50)}
        again = Book().run(list(range(50)), store=url, quiet=True, progress=False,
                           reuse=first.run_id)
        assert dict(again) == {d: expected(d) for d in range(50)}
        facts = [s.fact for k in store.read_run(again.run_id).values() for s in k]
        assert not [f for f in facts if isinstance(f, GrainReused)]
        assert len([f for f in facts if isinstance(f, GrainDispatched)]) == 50 * 4
    finally:
        store.close()
