"""Ray Data peer: ``flat_map`` -> actor-pool ``map_batches`` -> ``groupby(doc).map_groups``.

The idiomatic Ray Data way to write the fan-out/fan-in: the parent key and the
ordinal are application columns, and reassembly is a ``groupby`` on the parent with
a sort by ordinal inside each group (a shuffle barrier after the GPU stage). A
poisoned child can only mark its row; its siblings still run through the GPU stage.
"""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from bench.peers.common import ArrivalLog
from bench.workload import BenchConfig, assemble, fake_gpu, make_parents, render, trace_for


def render_rows(
    row: dict[str, Any], config: BenchConfig, trace_dir: str | None
) -> list[dict[str, Any]]:
    """flat_map UDF: one parent row -> its child rows."""
    start = time.time()
    children = render({"doc": int(row["doc"]), "n": int(row["n"])}, config)
    trace_for(trace_dir, "render").record(start, time.time(), 1)
    return children


class GpuBatches:
    """map_batches UDF on an actor pool: one fake-GPU call per batch of child rows."""

    def __init__(self, config: BenchConfig, trace_dir: str | None) -> None:
        self.config = config
        self.poisoned = frozenset(config.poisoned)
        self.trace = trace_for(trace_dir, "gpu")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.time()
        outputs = fake_gpu(batch["doc"].tolist(), batch["ordinal"].tolist(), self.config,
                           self.poisoned)
        poisoned = sum(1 for o in outputs if o.doc in self.poisoned)
        self.trace.record(start, time.time(), len(outputs), poisoned)
        return {
            "doc": np.array([o.doc for o in outputs], dtype=np.int64),
            "ordinal": np.array([o.ordinal for o in outputs], dtype=np.int64),
            "text": np.array([o.text for o in outputs], dtype=object),
            "error": np.array([o.error for o in outputs], dtype=object),
        }


def assemble_group(group: pd.DataFrame, config: BenchConfig, trace_dir: str | None) -> pd.DataFrame:
    """map_groups UDF: sort one parent's children by ordinal and assemble them."""
    start = time.time()
    group = group.sort_values("ordinal")
    result = assemble(int(group["doc"].iloc[0]), group["ordinal"].tolist(),
                      group["text"].tolist(), group["error"].tolist(), config)
    trace_for(trace_dir, "assemble").record(start, time.time(), 1)
    return pd.DataFrame([result])


def run(config: BenchConfig, trace_dir: str | None, log: ArrivalLog) -> None:
    """Build and drain the Ray Data pipeline (Ray is already initialised)."""
    import ray

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    # The pull-based sort shuffle: here it regroups 300 parents in ~1 s, where the
    # default hash shuffle (aggregator actors) took 10-26 s on the shared 2-core machine.
    shuffle = os.environ.get("BENCH_RAYDATA_SHUFFLE", "sort_shuffle_pull_based")
    ctx.shuffle_strategy = ray.data.context.ShuffleStrategy(shuffle)
    parents = make_parents(config)
    log.restart()
    # Two source blocks per declared CPU: one block per parent (the default here) makes
    # hundreds of tiny render tasks whose start-up starves the GPU pool on a small machine.
    blocks = min(len(parents), 2 * config.cpus)
    ds: ray.data.Dataset = ray.data.from_items(parents, override_num_blocks=blocks)
    ds = ds.flat_map(partial(render_rows, config=config, trace_dir=trace_dir), num_cpus=0.5)
    ds = ds.map_batches(
        GpuBatches,
        fn_constructor_kwargs={"config": config, "trace_dir": trace_dir},
        batch_size=config.batch_size,
        compute=ray.data.ActorPoolStrategy(size=config.gpus),
        num_gpus=1,
        num_cpus=0.1,
    )
    # 8 partitions (one per declared CPU) instead of the default 200: on a small
    # cluster each partition is a task, and 200 of them would only add start-up cost.
    ds = ds.groupby("doc", num_partitions=config.cpus).map_groups(
        partial(assemble_group, config=config, trace_dir=trace_dir),
        batch_format="pandas", num_cpus=0.5,
    )
    for row in ds.iter_rows():
        log.arrived(int(row["doc"]), dict(row))
