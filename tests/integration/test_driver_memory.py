"""Driver memory after a run (docs/ARCHITECTURE.md, "Bounded driver memory")."""

from __future__ import annotations

import sys

import pytest

import rayorch as ro
from rayorch.store.errors import RunNotFoundError, StoreClosedError
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def double(xs: list[int]) -> list[int]:
    return [2 * x for x in xs]


class Double(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.double = ro.RayModule(double, batch_size=64, num_cpus=0.25)

    def forward(self, x: ro.Port) -> ro.Port:
        return self.double(x)


def test_a_closed_run_leaves_no_lineage_in_the_process(ray_local: None) -> None:
    handle = Double().run(list(range(500)), micro_batch=4, max_active_sources=8, quiet=True,
                          progress=False)
    assert handle.collect() == [2 * x for x in range(500)]  # runs to the end and closes
    with pytest.raises(StoreClosedError, match="closed by its last user"):
        handle.store.list_runs()
    fresh = open_store(handle.store_url)  # the registry kept nothing of it
    with pytest.raises(RunNotFoundError):
        fresh.run_info(handle.run_id)
    fresh.close()
