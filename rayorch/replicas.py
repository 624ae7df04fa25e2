"""Driver replicas: a run any number of drivers share, join, take over and resume.

:func:`create_run` records a run (plan, manifest with every source, output sink);
:func:`join_run` (behind ``rayorch driver``/``resume``) starts one more driver on it:
the one driver, :class:`~rayorch.runtime.shard_driver.ShardDriver`, sharing the
run's shards (docs/ARCHITECTURE.md, "One driver", "Driver replicas").
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from rayorch.actors.shared_pool import kill_shared
from rayorch.core.plan import Plan
from rayorch.core.pool_sizing import DEFAULT_SIZING
from rayorch.driver import new_run_id
from rayorch.driver_inputs import DriverError, zip_inputs
from rayorch.runtime.delivery import CallerSink, ManifestFeed
from rayorch.runtime.pool_ledger import RayLedger
from rayorch.runtime.reuse_setup import reuse_of_run
from rayorch.runtime.session import (
    REPLICA_LEASE_TTL_S,
    DriverSession,
    build_pools,
    new_driver_id,
)
from rayorch.runtime.shard_driver import DriverConfig, LeaseMode, ShardDriver, log_to_stderr
from rayorch.storage import set_storage_options

__all__ = ["ReplicaHandle", "create_run", "join_run"]


def create_run(
    pipeline: type | str,
    inputs: Sequence[Iterable[Any]],
    *,
    store: str,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    run_id: str | None = None,
    out_dir: str | None = None,
    out_format: str = "jsonl",
    shard_size: int | None = None,
    micro_batch: int = 16,
    shards: int = 4,
    max_active_sources: int | None = 256,
    depth: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> str:
    """Create a run that any number of drivers can run (:func:`join_run`, ``rayorch driver``).

    ``pipeline`` is an importable ``ro.Pipeline`` class (or ``"pkg.module:Class"``) built
    with ``args``/``kwargs`` by every driver; ``inputs`` (one iterable per ``forward``
    argument) are recorded in full with the run; finished sources are written to
    ``out_dir`` as ``out_format`` (``"jsonl"``, ``"parquet"``, ``"jsonl.zst"``, ``"wds"``:
    :mod:`rayorch.runtime.formats`; ``shard_size``: parts rolled by size, for every driver)
    part files, read back with
    :func:`rayorch.runtime.sinks.read_outputs`; ``out_dir`` may be an object store URL
    (``s3://bucket/out``), reached with ``storage_options`` beyond the cloud's environment
    (this process's: never recorded). Returns the run id. Nothing runs until a driver joins.
    """
    if storage_options is not None:
        set_storage_options(storage_options)
    from rayorch.runtime.manifest import (
        check_storable,
        import_path,
        pipeline_path,
        record_manifest,
    )
    from rayorch.runtime.sinks import FileSink
    from rayorch.store.records.manifest import RunManifest
    from rayorch.store.registry import open_store

    if micro_batch < 1 or shards < 1:
        raise DriverError("micro_batch and shards must be >= 1")
    path = pipeline if isinstance(pipeline, str) else pipeline_path(pipeline)
    cls = import_path(path)
    if isinstance(pipeline, str):
        path = pipeline_path(cls)
    kwargs = dict(kwargs or {})
    plan = cls(*args, **kwargs).compile()
    rows_iter, _ = zip_inputs(plan, inputs)
    rows = [tuple(row) for row in rows_iter]
    check_storable(rows, args, kwargs)
    run_id = run_id or new_run_id(plan)
    if out_dir is not None:  # refuse a foreign directory now, not in every driver later
        out_dir = FileSink(out_dir, out_format, run_id=run_id, shard_size=shard_size).url
    manifest = RunManifest(path, tuple(args), kwargs, tuple(rows),
                           None if out_dir is None else str(out_dir), max_active_sources, depth,
                           out_format)
    lineage = open_store(store)
    try:
        lineage.open_run(run_id, plan, shards=shards, micro_batch=micro_batch,
                         config={"max_active_sources": max_active_sources,
                                 "sources": len(rows), "replicas": True})
        record_manifest(lineage, run_id, manifest)
    finally:
        lineage.close()
    return run_id



def _refuse_lost_shards(lineage: Any, run_id: str) -> None:
    """A shard marked done whose facts are gone cannot be continued (nor silently skipped)."""
    from rayorch.runtime.shard_leases import LineageLostError

    lost = [k for k in sorted(lineage.done_shards(run_id))
            if not lineage.read(run_id, k, limit=1, payloads=False)]
    if lost:
        raise LineageLostError(
            f"run {run_id}: shard {lost[0]} is marked done but the store holds none of its "
            f"facts{f' (nor those of shards {lost[1:]})' if lost[1:] else ''} (keys evicted or "
            "deleted, or a lost Redis Cluster master), so this run cannot be continued; "
            f"`rayorch audit {run_id}` lists what is missing; start the run again")


class ReplicaHandle:
    """One driver on a shared run: an iterator of the ``(index, value)`` it emitted.

    Iterate it (or call :meth:`wait`) to drive; it returns when every shard of the run
    is done, whichever driver did the work. ``.stats`` counts this driver's part.
    """

    def __init__(self, driver: ShardDriver) -> None:
        self._driver = driver
        self._results: Generator[tuple[int, Any], None, None] = driver.results()

    @property
    def run_id(self) -> str:
        return self._driver.run_id

    @property
    def driver_id(self) -> str:
        return self._driver.driver_id

    @property
    def stats(self) -> Any:
        """:class:`rayorch.runtime.replica_state.ReplicaStats` of this driver."""
        return self._driver.counters

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self

    def __next__(self) -> tuple[int, Any]:
        return next(self._results)

    def wait(self) -> int:
        """Drive until the run is complete; how many outputs this driver emitted."""
        for _ in self:
            pass
        return int(self._driver.counters.outputs_emitted)

    def close(self) -> None:
        """Leave the run (the other drivers, or a later one, take its shards over)."""
        self._driver.acknowledge_held()
        self._results.close()
        self._driver.close()

    def __enter__(self) -> ReplicaHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def join_run(
    run_id: str,
    *,
    store: str,
    address: str | None = None,
    driver_id: str | None = None,
    lease_ttl_s: float | None = None,
    quiet: bool = False,
    out_dir: str | None = None,
    out_format: str | None = None,
    require_sink: bool = False,
    trust: Sequence[str] | None = None,
    storage_options: Mapping[str, str] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> ReplicaHandle:
    """Join ``run_id`` as one more driver (starting one on a run whose drivers died resumes it).

    Outputs go to the run's file sink (``create_run(out_dir=, out_format=)``), else to
    ``out_dir`` as ``out_format`` (default ``"jsonl"``; see :mod:`rayorch.runtime.sinks`),
    else to the caller iterating the returned :class:`ReplicaHandle`.
    ``require_sink=True`` (the CLI) refuses a run with no place for its outputs.
    ``trust`` lists the modules the run's pipeline may be imported from (with
    ``$RAYORCH_TRUSTED_MODULES``; docs/ARCHITECTURE.md, "Trust model").
    ``storage_options``: object store settings for the sink and payloads (kept in memory).
    ``metrics_port``: this driver's Prometheus endpoint (rayorch/runtime/metrics.py).
    """
    if storage_options is not None:
        set_storage_options(storage_options)
    from rayorch.runtime.manifest import build_pipeline
    from rayorch.runtime.sinks import sink_for_run
    from rayorch.runtime.trust import trusted_modules
    from rayorch.runtime.user_code import ship_user_code
    from rayorch.store.records.manifest import ManifestError, RunManifest

    # No store check: the run's records are its first reads (a store it cannot reach fails there).
    session = DriverSession(store, address=address, check=False, metrics_port=metrics_port,
                            metrics_host=metrics_host)
    with session:
        lineage = session.store
        info = lineage.run_info(run_id)
        blob = lineage.load_manifest(run_id)
        if blob is None:
            raise ManifestError(
                f"run {run_id} has no manifest, so no other driver can run it (its Pipeline.run "
                "could not record one and said why on stderr when it started); make runs "
                "resumable with rayorch.replicas.create_run or a Pipeline.run that can be recorded")
        manifest = RunManifest.decode(blob)
        _refuse_lost_shards(lineage, run_id)
        # The pipeline class is checked before anything else acts on the manifest.
        pipeline = build_pipeline(manifest, trusted_modules(trust))
        recorded = (manifest.out_dir, manifest.out_format) if manifest.out_dir else info.sink
        file_sink = sink_for_run(run_id, recorded[0] if recorded else None,
                                 recorded[1] if recorded else "jsonl", out_dir,
                                 out_format)  # the run's own sink wins
        if file_sink is not None and recorded is None:  # so audit finds it without --out-dir
            lineage.record_sink(run_id, file_sink.url, file_sink.format)
        if file_sink is None and require_sink:
            raise DriverError(
                f"run {run_id} delivered its outputs to the caller of Pipeline.run, so a resume "
                "needs a place for the ones nobody received: pass --out-dir DIR")
        plan: Plan = pipeline.compile()
        if plan.fingerprint() != info.fingerprint:
            raise ManifestError(
                f"the pipeline {manifest.pipeline} compiles to plan {plan.fingerprint()} but run "
                f"{run_id} was created with plan {info.fingerprint}: the code changed since; "
                "run the code version the run was created with")
        session.start_ray(plan)
        ship_user_code([type(pipeline), *(m.target for m in plan.modules if m.target)])
        driver_id = driver_id or new_driver_id()
        log = (lambda line: None) if quiet else log_to_stderr
        ledger = (RayLedger(run_id, driver_id, log=log)  # the pools the other drivers sized
                  if any(m.options.sizes_itself for m in plan.modules) else None)
        pools, call_module = build_pools(plan, store, run_id, depth=manifest.depth, shared=True,
                                         live=ledger.live() if ledger is not None else None)

    def release(run_done: bool) -> None:
        for pool in pools.values():
            if run_done:
                kill_shared(pool)
            pool.shutdown()
        with contextlib.suppress(Exception):
            lineage.heartbeat(run_id, driver.driver_id, 0)

    config = DriverConfig(LeaseMode.SHARE, lease_ttl_s or REPLICA_LEASE_TTL_S, info.micro_batch,
                          manifest.max_active_sources, progress=False, log=log,
                          sizing=DEFAULT_SIZING)
    sink: Any = file_sink if file_sink is not None else CallerSink(ordered=False)
    driver = session.start(run_id=run_id, info=info, plan=plan, driver_id=driver_id, pools=pools,
                           call_module=call_module,
                           feed=ManifestFeed(manifest.sources, info, manifest.identities),
                           sink=sink, config=config, release=release,
                           reuse=reuse_of_run(lineage, plan, info), ledger=ledger)
    if not quiet:
        print(f"rayorch: driver {driver.driver_id} joined run {run_id}", file=sys.stderr)
    return ReplicaHandle(driver)
