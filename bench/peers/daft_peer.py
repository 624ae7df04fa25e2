"""Daft peer: render UDF -> ``explode`` -> batched class UDF -> ``groupby(doc)`` -> reassembly.

The idiomatic Daft way to write the fan-out/fan-in: the parent key and the ordinal are
columns; after the GPU UDF a ``groupby(doc).agg(list_agg)`` collects each parent's
children (in no guaranteed order), and a row UDF sorts them by ordinal and assembles.
A poisoned child can only mark its row; its siblings still run through the GPU UDF.

Runner: Daft's Ray runner on the same in-process Ray as the other systems (same
declared CPUs and GPUs; the GPU UDF instances are Ray actors with ``gpus=1``), which is
how the paper ran Daft on 64 GPUs. ``BENCH_DAFT_RUNNER=native`` selects Daft's native
(single-process) runner instead, for comparison.
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench.peers.common import ArrivalLog
from bench.workload import BenchConfig, assemble, fake_gpu, make_parents, render, trace_for


def build(config: BenchConfig, trace_dir: str | None) -> Any:
    """The lazy Daft DataFrame of parent results (one row per parent)."""
    import daft
    from daft import DataType, col

    @daft.func(return_dtype=DataType.list(DataType.int64()))
    def render_ordinals(doc: int, n: int) -> list[int]:
        start = time.time()
        children = render({"doc": doc, "n": n}, config)
        trace_for(trace_dir, "render").record(start, time.time(), 1)
        return [c["ordinal"] for c in children]

    gpu_output = DataType.struct({"text": DataType.string(), "error": DataType.string()})

    @daft.cls(gpus=1, max_concurrency=config.gpus)
    class FakeGpu:
        def __init__(self) -> None:
            self.poisoned = frozenset(config.poisoned)
            self.trace = trace_for(trace_dir, "gpu")

        @daft.method.batch(return_dtype=gpu_output, batch_size=config.batch_size, unnest=True)
        def __call__(self, docs: daft.Series, ordinals: daft.Series) -> list[dict[str, str]]:
            start = time.time()
            outputs = fake_gpu(docs.to_pylist(), ordinals.to_pylist(), config, self.poisoned)
            poisoned = sum(1 for o in outputs if o.doc in self.poisoned)
            self.trace.record(start, time.time(), len(outputs), poisoned)
            return [{"text": o.text, "error": o.error} for o in outputs]

    result_type = DataType.struct({
        "doc": DataType.int64(), "children": DataType.int64(), "in_order": DataType.bool(),
        "chars": DataType.int64(), "error": DataType.string(),
    })

    @daft.func(return_dtype=result_type)
    def assemble_doc(
        doc: int, ordinals: list[int], texts: list[str], errors: list[str]
    ) -> dict[str, Any]:
        start = time.time()
        ordered = sorted(zip(ordinals, texts, errors, strict=True))
        result = assemble(doc, [o for o, _, _ in ordered], [t for _, t, _ in ordered],
                          [e for _, _, e in ordered], config)
        trace_for(trace_dir, "assemble").record(start, time.time(), 1)
        return result

    df = daft.from_pylist(make_parents(config))
    df = df.with_column("ordinal", render_ordinals(col("doc"), col("n"))).explode("ordinal")
    gpu: Any = FakeGpu()  # daft's decorators type the call as Series -> list
    df = df.select(col("doc"), col("ordinal"), gpu(col("doc"), col("ordinal")))
    df = df.groupby("doc").agg(
        col("ordinal").list_agg(), col("text").list_agg(), col("error").list_agg()
    )
    return df.select(
        assemble_doc(col("doc"), col("ordinal"), col("text"), col("error")).alias("result")
    )


def run(config: BenchConfig, trace_dir: str | None, log: ArrivalLog) -> None:
    """Build and drain the Daft pipeline (Ray is already initialised)."""
    import daft

    if os.environ.get("BENCH_DAFT_RUNNER", "ray") == "native":
        daft.set_runner_native()
    else:
        daft.set_runner_ray(noop_if_initialized=True)
    log.restart()
    df = build(config, trace_dir)
    for row in df.iter_rows():
        result = row["result"]
        log.arrived(int(result["doc"]), result)
