"""Each benchmark system runs the shared workload on real Ray and returns correct output."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers.common import SYSTEMS, run_in_subprocess
from bench.workload import BenchConfig, largest_parents, make_parents

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ENGINE = {"rayorch": "ray", "raydata": "ray.data", "daft": "daft"}
SMALL = BenchConfig(parents=12, max_children=60, gpu_a=0.005, gpu_b=0.0005, batch_size=8)


@pytest.mark.parametrize("system", SYSTEMS)
def test_system_reassembles_every_parent_and_fails_only_poisoned_ones(
    system: str, tmp_path: Path
) -> None:
    pytest.importorskip(ENGINE[system])  # Ray Data and Daft come with the bench extra
    poisoned = largest_parents(make_parents(SMALL), 0.2)
    config = SMALL.replace(poisoned=poisoned)
    record = run_in_subprocess(system, config, tmp_path, system, timeout_s=170)
    # run_in_subprocess raises BenchError if any parent came back wrong.
    assert record["failed_parents"] == len(poisoned)
    assert record["correct_parents"] == SMALL.parents - len(poisoned)
    assert record["gpu_poisoned_records"] >= len(poisoned)
    assert len(record["arrivals_s"]) == SMALL.parents
    assert record["first_parent_s"] <= record["p50_parent_s"] <= record["e2e_s"]
