"""The public entry points of the driver: ``Pipeline.run``, ``create_run``, ``join_run``.

All of them run the one driver, :class:`rayorch.runtime.shard_driver.ShardDriver`
(docs/ARCHITECTURE.md, "One driver"):

* :func:`run_pipeline` (behind ``Pipeline.run``) holds every shard of a new run and
  hands outputs to the caller's iterator, :class:`RunHandle`;
* :func:`join_run` (behind ``rayorch driver``/``resume``) shares a recorded run's
  shards with its other drivers and writes outputs to a file sink, or hands them to
  its caller (:class:`ReplicaHandle`) when there is none.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.outcome import FailedResult
from rayorch.core.plan import Plan
from rayorch.runtime.delivery import CallerSink, IteratorFeed, ManifestFeed
from rayorch.runtime.session import (
    LEASE_TTL_S,
    REPLICA_LEASE_TTL_S,
    build_pools,
    commits_in_actor,
    ensure_ray,
    new_driver_id,
    redact_url,
    with_quick_retries,
)
from rayorch.runtime.shard_driver import DriverConfig, LeaseMode, ShardDriver, log_to_stderr
from rayorch.store.base import SHARED_STORE_SCHEMES

__all__ = ["DriverError", "ReplicaHandle", "RunHandle", "create_run", "join_run", "run_pipeline"]

class DriverError(RayorchError):
    """The driver was given inputs or options it cannot run."""


class RunHandle:
    """An iterator of ``(index, value)`` per source item, as parents complete.

    ``value`` is the output (a tuple for several outputs) or a
    :class:`~rayorch.core.outcome.FailedResult` when it is not Present.
    With ``ordered=True`` items come back in source order.

    Delivery (docs/ARCHITECTURE.md): an item is delivered when you ask for the next
    one or :meth:`close` the handle; if the process dies while you hold item *i*, a
    resume delivers *i* again (once) — never loses it. Leaving a ``with`` block by an
    exception does not count as having received the item you held.

    >>> handle = MyPipeline().run(["a.pdf", "b.pdf"])      # doctest: +SKIP
    >>> print(handle.run_id)                                # doctest: +SKIP
    >>> docs = handle.collect()                             # doctest: +SKIP
    """

    def __init__(self, driver: ShardDriver, store_url: str) -> None:
        self._driver = driver
        self._store_url = store_url
        self._results = self._iterate()
        self._closed = False
        self._started = time.perf_counter()
        self._elapsed: float | None = None
        self._iterated = False
        self._collected: list[Any] | None = None

    @property
    def run_id(self) -> str:
        return self._driver.run_id

    @property
    def store_url(self) -> str:
        return self._store_url

    @property
    def store(self) -> Any:
        """The run's :class:`~rayorch.store.base.LineageStore` (e.g. for ``audit_run``)."""
        return self._driver.store

    @property
    def stats(self) -> Any:
        """Live counters of the run (:class:`rayorch.progress.RunStats`)."""
        return self._driver.stats

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self

    def __next__(self) -> tuple[int, Any]:
        self._iterated = True
        return next(self._results)

    @property
    def outputs(self) -> Any:
        """Upstream RayOrch's ``RunResult.outputs``: runs to the end, in source order.

        One output: a list with one value per source item. Several outputs: one list per
        output (a tuple for ``return a, b``, a dict for ``return {"a": a, ...}``), so one
        failed output does not hide the others. A non-Present value is a
        ``FailedResult`` (``ro.OutputIssue``) with its outcome and cause.
        """
        values = self.collect()
        names = self._driver.plan.output_names
        if len(names) == 1:
            return values
        columns: list[list[Any]] = [[] for _ in names]
        for value in values:
            row = value.outputs if isinstance(value, FailedResult) else value
            assert row is not None  # several outputs: a FailedResult carries them all
            for column, item in zip(columns, row, strict=True):
                column.append(item)
        if all(name == f"output{i}" for i, name in enumerate(names)):
            return tuple(columns)
        return dict(zip(names, columns, strict=True))

    @property
    def actors_replaced(self) -> int:
        """How many actors were replaced (crash, timeout, ``ro.ActorFailure``); an exception
        from a UDF never replaces its actor."""
        return sum(pool.replaced for pool in self._driver.pools.values())

    @property
    def elapsed_s(self) -> float:
        """Seconds from the start of the run to its end (so far, while it runs)."""
        if self._elapsed is not None:
            return self._elapsed
        return time.perf_counter() - self._started

    def _iterate(self) -> Generator[tuple[int, Any], None, None]:
        try:
            yield from self._driver.results()
            self._elapsed = time.perf_counter() - self._started
        finally:
            self._release()

    def collect(self) -> list[Any]:
        """Run to the end; the values in source order (``FailedResult`` where not Present).

        Call it (or :attr:`outputs`) instead of iterating, not after: the values already
        handed out by iteration are not kept.
        """
        if self._collected is None:
            if self._iterated:
                raise DriverError(
                    "this run was already iterated, so its results were handed out and not "
                    "kept; call collect() / .outputs instead of iterating, not after"
                )
            pairs = sorted(self, key=lambda pair: pair[0])
            self._collected = [value for _, value in pairs]
        return self._collected

    def close(self) -> None:
        """Stop the run (also mid-way), the item you hold counting as delivered (idempotent)."""
        if not self._closed:
            self._driver.acknowledge_held()
        self._abort()

    def _abort(self) -> None:
        self._results.close()
        self._release()

    def _release(self) -> None:
        if not self._closed:
            self._closed = True
            self._driver.close()

    def __enter__(self) -> RunHandle:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abort()  # the caller failed while holding an item: not delivered

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: no one to tell
            self._abort()


def _zip_inputs(
    plan: Plan, inputs: Sequence[Iterable[Any]]
) -> tuple[Iterator[tuple[Any, ...]], int | None]:
    expected = len(plan.input_ports)
    if len(inputs) != expected:
        raise DriverError(
            f"{plan.name}.forward takes {expected} input(s) but run() got {len(inputs)}; pass "
            "one iterable per forward argument, e.g. run(pdf_paths) for forward(self, pdfs)"
        )
    sizes = [len(x) for x in inputs if hasattr(x, "__len__")]  # type: ignore[arg-type]
    if len(sizes) == len(inputs) and len(set(sizes)) > 1:
        raise DriverError(
            f"the inputs of run() have different lengths {sizes}; every forward argument "
            "needs one value per source item"
        )
    total = sizes[0] if sizes and len(sizes) == len(inputs) else None

    def rows() -> Iterator[tuple[Any, ...]]:
        try:
            yield from zip(*inputs, strict=True)
        except ValueError as exc:
            raise DriverError(
                f"the inputs of run() ran out at different lengths ({exc}); every forward "
                "argument needs one value per source item"
            ) from None

    return rows(), total



def _new_run_id(plan: Plan) -> str:
    return f"{plan.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def run_pipeline(
    pipeline: Any,
    inputs: Sequence[Iterable[Any]],
    *,
    store: str = "memory://",
    ordered: bool = True,
    progress: bool | None = None,
    address: str | None = None,
    run_id: str | None = None,
    micro_batch: int = 16,
    shards: int = 1,
    max_active_sources: int | None = 256,
    depth: int | None = None,
    quiet: bool = False,
    lease_ttl_s: float = LEASE_TTL_S,
    input_batch_size: int | None = None,
    max_active_input_batches: int | None = None,
    ray_init_kwargs: dict[str, Any] | None = None,
) -> RunHandle:
    """Run ``pipeline`` over ``inputs`` (one iterable per ``forward`` argument).

    * ``store``: ``"memory://"`` (in-process, the default) or ``"redis://host:port/db"``.
    * ``ordered``: yield in source order (otherwise as parents complete).
    * ``progress``: live table; ``None`` = on when stdout is a terminal.
    * ``address``: a Ray cluster to join; without it a local Ray is started if needed.
    * ``run_id``: name of the run in the store (default: a fresh id, printed to stderr).
    * ``micro_batch``: sources admitted together (and the shard granule);
      ``shards``: lineage-store shards; ``max_active_sources``: admitted but unfinished
      sources per shard at most (``None`` = unbounded); ``depth``: batches queued per
      actor; ``lease_ttl_s``: the shard leases' TTL (how soon ``rayorch resume`` can
      take over).

    On a shared store (``redis://``, ``rediss://``, ``redis+cluster://``) the run records
    a manifest (the pipeline's import path and constructor arguments, every source), so that
    ``rayorch resume RUN --store URL --out-dir DIR`` delivers what this caller did not
    receive if this process dies; when it cannot (a class in ``__main__``, generator
    inputs, un-msgpack-able values) one line on stderr says why, and the run goes on.

    Upstream RayOrch's knobs are accepted: ``input_batch_size`` (sources admitted together:
    ``micro_batch``) and ``max_active_input_batches`` (how many such batches may be
    unfinished at once: ``max_active_sources = input_batch_size * max_active_input_batches``,
    default 1 as upstream; without ``input_batch_size`` upstream admits the whole input as
    one batch, so the number of active sources is not bounded). ``ray_init_kwargs`` go to
    ``ray.init`` when this call starts Ray (as upstream's).
    """
    from rayorch.store.base import open_store

    micro_batch, max_active_sources = _upstream_admission(
        micro_batch, max_active_sources, input_batch_size, max_active_input_batches)
    if micro_batch < 1 or shards < 1:
        raise DriverError("micro_batch and shards must be >= 1")
    plan = pipeline.compile()
    rows, total = _zip_inputs(plan, inputs)
    fresh = run_id is None
    run_id = run_id or _new_run_id(plan)
    if ray_init_kwargs:
        _init_ray(address, ray_init_kwargs)
    ensure_ray(address)
    lineage = open_store(with_quick_retries(store))
    try:
        created = fresh
        if not fresh:
            _refuse_finished_run(lineage, run_id, store)
            created = not _run_exists(lineage, run_id)
        info = lineage.open_run(run_id, plan, shards=shards, micro_batch=micro_batch,
                                config={"max_active_sources": max_active_sources})
        if store.lower().startswith(SHARED_STORE_SCHEMES):
            _record_manifest(lineage, run_id, pipeline, inputs, depth=depth,
                             max_active_sources=max_active_sources)
        # Pools first: actor start-up can outlast a short lease TTL; the leases are
        # taken when the driver starts.
        pools, call_module = build_pools(plan, store, run_id, depth=depth)
    except BaseException:
        lineage.close()
        raise

    def release(run_done: bool) -> None:
        for pool in pools.values():
            pool.shutdown()
        lineage.close()

    config = DriverConfig(LeaseMode.HOLD_ALL, lease_ttl_s, micro_batch, max_active_sources,
                          progress=progress, new_run=created)
    driver = ShardDriver(store=lineage, run_id=run_id, info=info, plan=plan,
                         driver_id=new_driver_id(), pools=pools, call_module=call_module,
                         feed=IteratorFeed(rows, info, total), sink=CallerSink(ordered),
                         config=config, on_close=release)
    if not quiet:
        if commits_in_actor(store):
            hint = f"audit with: rayorch audit {run_id} --store {redact_url(store)}"
        else:
            hint = "in-memory lineage: run with store='redis://...' to audit it later"
        print(f"rayorch: run {run_id} ({hint})", file=sys.stderr)
    return RunHandle(driver, store)


def _init_ray(address: str | None, kwargs: dict[str, Any]) -> None:
    """Start Ray with the caller's ``ray.init`` arguments (unless it runs already)."""
    import ray

    if not ray.is_initialized():
        # A local Ray of its own unless an address is given (never a stranger's cluster).
        options = {"include_dashboard": False, "address": address or "local", **kwargs}
        ray.init(**options)


def _upstream_admission(
    micro_batch: int, max_active_sources: int | None, input_batch_size: int | None,
    max_active_input_batches: int | None,
) -> tuple[int, int | None]:
    """``(micro_batch, max_active_sources)`` from upstream RayOrch's admission knobs."""
    for name, value in (("input_batch_size", input_batch_size),
                        ("max_active_input_batches", max_active_input_batches)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise DriverError(f"{name}={value!r}: give an int >= 1")
    if input_batch_size is None:
        if max_active_input_batches is None:
            return micro_batch, max_active_sources
        return micro_batch, None  # upstream: the whole input is one input batch
    return input_batch_size, input_batch_size * (max_active_input_batches or 1)


def _refuse_finished_run(lineage: Any, run_id: str, store_url: str) -> None:
    """A finished run's id cannot run again: one line naming it and the way out."""
    from rayorch.runtime.status import refuse_finished_run

    refuse_finished_run(lineage, run_id, redact_url(store_url))


def _run_exists(lineage: Any, run_id: str) -> bool:
    from rayorch.store.errors import RunNotFoundError

    try:
        lineage.run_info(run_id)
    except RunNotFoundError:
        return False
    return True


def _record_manifest(lineage: Any, run_id: str, pipeline: Any, inputs: Sequence[Iterable[Any]],
                     *, depth: int | None, max_active_sources: int | None) -> None:
    """Make a ``Pipeline.run`` resumable; one line on stderr (never a failure) when it cannot."""
    from rayorch.runtime.manifest import ManifestError, manifest_of_run

    try:
        manifest = manifest_of_run(pipeline, inputs, depth=depth,
                                   max_active_sources=max_active_sources)
    except (ManifestError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        print(f"rayorch: run {run_id} will not be resumable: {reason}", file=sys.stderr)
        return
    lineage.save_manifest(run_id, manifest.encode())


# -- driver replicas ------------------------------------------------------------------------
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
    micro_batch: int = 16,
    shards: int = 4,
    max_active_sources: int | None = 256,
    depth: int | None = None,
) -> str:
    """Create a run that any number of drivers can run (:func:`join_run`, ``rayorch driver``).

    ``pipeline`` is an importable ``ro.Pipeline`` class (or ``"pkg.module:Class"``) built
    with ``args``/``kwargs`` by every driver; ``inputs`` (one iterable per ``forward``
    argument) are recorded in full with the run; finished sources are written to
    ``out_dir`` as ``out_format`` (``"jsonl"`` or ``"parquet"``) part files, read back with
    :func:`rayorch.runtime.sinks.read_outputs`. Returns the run id. Nothing runs until a
    driver joins.
    """
    from rayorch.runtime.manifest import (
        RunManifest,
        check_storable,
        import_path,
        pipeline_path,
    )
    from rayorch.runtime.sinks import FileSink
    from rayorch.store.base import open_store

    if micro_batch < 1 or shards < 1:
        raise DriverError("micro_batch and shards must be >= 1")
    path = pipeline if isinstance(pipeline, str) else pipeline_path(pipeline)
    cls = import_path(path)
    if isinstance(pipeline, str):
        path = pipeline_path(cls)
    kwargs = dict(kwargs or {})
    plan = cls(*args, **kwargs).compile()
    rows_iter, _ = _zip_inputs(plan, inputs)
    rows = [tuple(row) for row in rows_iter]
    check_storable(rows, args, kwargs)
    run_id = run_id or _new_run_id(plan)
    if out_dir is not None:  # refuse a foreign directory now, not in every driver later
        FileSink(out_dir, out_format, run_id=run_id)
    manifest = RunManifest(path, tuple(args), kwargs, tuple(rows),
                           None if out_dir is None else str(out_dir), max_active_sources, depth,
                           out_format)
    lineage = open_store(store)
    try:
        lineage.open_run(run_id, plan, shards=shards, micro_batch=micro_batch,
                         config={"max_active_sources": max_active_sources,
                                 "sources": len(rows), "replicas": True})
        lineage.save_manifest(run_id, manifest.encode())
    finally:
        lineage.close()
    return run_id



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
) -> ReplicaHandle:
    """Join ``run_id`` as one more driver (starting one on a run whose drivers died resumes it).

    Outputs go to the run's file sink (``create_run(out_dir=, out_format=)``), else to
    ``out_dir`` as ``out_format`` (default ``"jsonl"``; see :mod:`rayorch.runtime.sinks`),
    else to the caller iterating the returned :class:`ReplicaHandle`.
    ``require_sink=True`` (the CLI) refuses a run with no place for its outputs.
    ``trust`` lists the modules the run's pipeline may be imported from (with
    ``$RAYORCH_TRUSTED_MODULES``; docs/ARCHITECTURE.md, "Trust model").
    """
    from rayorch.runtime.manifest import ManifestError, RunManifest
    from rayorch.runtime.sinks import sink_for_run
    from rayorch.runtime.trust import trusted_modules
    from rayorch.runtime.user_code import ship_user_code
    from rayorch.store.base import open_store

    lineage = open_store(with_quick_retries(store))
    try:
        info = lineage.run_info(run_id)
        blob = lineage.load_manifest(run_id)
        if blob is None:
            raise ManifestError(
                f"run {run_id} has no manifest, so no other driver can run it (its Pipeline.run "
                "could not record one and said why on stderr when it started); make runs "
                "resumable with rayorch.driver.create_run or a Pipeline.run that can be recorded")
        manifest = RunManifest.decode(blob)
        # The pipeline class is checked before anything else acts on the manifest.
        pipeline = manifest.build_pipeline(trusted_modules(trust))
        file_sink = sink_for_run(run_id, manifest.out_dir, manifest.out_format, out_dir,
                                 out_format)  # the run's own sink wins
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
        ensure_ray(address)
        ship_user_code([type(pipeline), *(m.target for m in plan.modules if m.target)])
        pools, call_module = build_pools(plan, store, run_id, depth=manifest.depth, shared=True)
    except BaseException:
        lineage.close()
        raise

    def release(run_done: bool) -> None:
        for pool in pools.values():
            if run_done:
                pool.kill_shared()
            pool.shutdown()
        with contextlib.suppress(Exception):
            lineage.heartbeat(run_id, driver.driver_id, 0)
        lineage.close()

    log = (lambda line: None) if quiet else log_to_stderr
    config = DriverConfig(LeaseMode.SHARE, lease_ttl_s or REPLICA_LEASE_TTL_S, info.micro_batch,
                          manifest.max_active_sources, progress=False, log=log)
    sink: Any = file_sink if file_sink is not None else CallerSink(ordered=False)
    driver = ShardDriver(store=lineage, run_id=run_id, info=info, plan=plan,
                         driver_id=driver_id or new_driver_id(), pools=pools,
                         call_module=call_module, feed=ManifestFeed(manifest.sources, info),
                         sink=sink, config=config, on_close=release)
    if not quiet:
        print(f"rayorch: driver {driver.driver_id} joined run {run_id}", file=sys.stderr)
    return ReplicaHandle(driver)
