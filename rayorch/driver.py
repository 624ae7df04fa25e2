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
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

from rayorch.core.outcome import FailedResult
from rayorch.core.plan import Plan
from rayorch.core.pool_sizing import DEFAULT_SIZING, SizingSettings
from rayorch.driver_inputs import DriverError, check_indexed, checked_order, zip_inputs
from rayorch.runtime.delivery import CallerSink, IteratorFeed, Row
from rayorch.runtime.ray_pools import RayPools
from rayorch.runtime.session import (
    LEASE_TTL_S,
    DriverSession,
    build_pools,
    commits_in_actor,
    new_driver_id,
    redact_url,
)
from rayorch.runtime.shard_driver import DriverConfig, LeaseMode, ShardDriver
from rayorch.runtime.sinks import FileSink
from rayorch.storage import set_storage_options
from rayorch.store.registry import is_shared_store

__all__ = ["DriverError", "Executor", "RunHandle", "new_run_id", "run_pipeline"]


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
    def pool_sizer(self) -> Any:
        """How the pools that size themselves changed (``history``, ``binding()``,
        ``summary()``: ``runtime/pool_sizer.py``); None when every pool has a fixed size."""
        return self._driver.sizer

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

    def _ray_pools(self) -> dict[str, Any]:
        pools = self._driver.pools
        assert isinstance(pools, RayPools)
        return pools.pools

    @property
    def actors_up_at(self) -> float | None:
        """``time.monotonic()`` when every pool's actors were first up (None while one
        starts): a run starts while its actors start, so this ends its start-up."""
        times = [pool.ready_at for pool in self._ray_pools().values()]
        return None if None in times else max(t for t in times if t is not None)

    @property
    def actors_replaced(self) -> int:
        """How many actors were replaced (crash, timeout, ``ro.ActorFailure``); an exception
        from a UDF never replaces its actor."""
        return self._driver.pools.replaced()

    @property
    def metrics_url(self) -> str | None:
        """Where the run's Prometheus metrics are served (``metrics_port=``), or None."""
        return self._driver.watch.metrics_url

    @property
    def actors_recycled(self) -> int:
        """How many actors were recycled past their module's ``max_rss``/``max_batches``
        (each finished its batches first: no failure, no retry)."""
        return self._driver.stats.actors_recycled

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


def new_run_id(plan: Plan) -> str:
    """A fresh run id: ``<pipeline>-<date>-<time>-<6 hex>``."""
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
    admission_order: Sequence[int] | None = None,
    sink: FileSink | None = None,
    storage_options: Mapping[str, str] | None = None,
    reuse: str | None = None,
    no_reuse: Sequence[str] = (),
    pool_sizing: SizingSettings = DEFAULT_SIZING,
    pool_budget: Mapping[str, float] | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    identities: Sequence[str | None] | None = None,
    indexed: Iterable[Row] | None = None,
) -> RunHandle:
    """Run ``pipeline`` over ``inputs`` (one iterable per ``forward`` argument).

    * ``store``: ``"memory://"`` (in-process, the default) or ``"redis://host:port/db"``.
    * ``ordered``: yield in source order (otherwise as parents complete).
    * ``progress``: live table; ``None`` = on when stdout is a terminal.
    * ``address``: a Ray cluster to join; without it, unless Ray runs already, a private
      local Ray sized for the pipeline's pools on this machine's cores and GPUs, as the
      jobs' (``rayorch.runtime.ray_cluster.start_ray_for``).
    * ``run_id``: name of the run in the store (default: a fresh id, printed to stderr).
    * ``micro_batch``: sources admitted together (and the shard granule);
      ``shards``: lineage-store shards; ``max_active_sources``: admitted but unfinished
      sources per shard at most (``None`` = unbounded); ``depth``: batches queued per
      actor; ``lease_ttl_s``: the shard leases' TTL (how soon ``rayorch resume`` can
      take over).
    * ``admission_order``: the input positions to run, in the order to admit them (e.g.
      the largest files first); each source keeps its input position as its index in the
      lineage and in the results, so ``rayorch show RUN N`` is input ``N``. Positions left
      out are not run (a run of some positions is not resumable with ``rayorch resume``).
    * ``indexed``: instead of ``inputs``, the sources as ``(id, row, identity)`` (``row``:
      one value per ``forward`` argument; ``identity``: what the listing said of the file it
      names, or None) in the order to admit them, read lazily as admission
      needs them: a streamed listing (``rayorch run pdf``, :mod:`rayorch.pipelines.inputs`)
      admits its first source before the rest is listed. Ids are distinct and never reused;
      no manifest is recorded (the job's ``--resume`` re-reads its input spec), and
      ``ordered=True`` is refused (the ids are not known up front).
    * ``sink``: a :class:`~rayorch.runtime.sinks.FileSink` of this run (its ``run_id``)
      to deliver to, as ``rayorch driver`` does: each output is written to a part file
      and its ``OutputEmitted`` names it; the handle yields each output once it is
      delivered there (the job commands, ``rayorch run pdf|video``).
    * ``reuse``: an earlier run of the store (its id, or ``"latest"``: the newest complete
      run of a plan of the same name) whose Grains this run reuses where the Call
      fingerprint and the input digest are the same (docs/ARCHITECTURE.md, "Reuse");
      ``no_reuse``: Call ids that always run.
    * ``identities``: one per input position, what the listing said of the file or object
      it names (``rayorch.pipelines.sources.list_inputs``: ``Listed.identity``, its size
      with version, ETag or mtime): what reuse keys the source by. Without them a local
      file's comes from its metadata (a ``stat``), and a source on an object store is not
      reused (the driver never reads or asks for an input itself).
    * ``storage_options``: object store settings (``endpoint``, ``region``, ...) for
      ``s3://``/``gs://``/``az://`` paths beyond the cloud's environment, this process's
      and its actors' (kept in memory: never printed or recorded).
    * ``pool_sizing``: how pools with ``replicas=(min, max)`` or ``"auto"`` size themselves
      (``rayorch.core.pool_sizing.SizingSettings``); ``pool_budget``: the most this run's
      pools may hold (``{"GPU": 4}``; default: whatever is free).
    * ``metrics_port``: serve the run's Prometheus metrics on ``metrics_host`` (127.0.0.1)
      at this port while it runs (0: a free port; ``RunHandle.metrics_url`` says which;
      rayorch/runtime/metrics.py lists the series).

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
    ``ray.init`` when this call starts Ray (as upstream's; then nothing is sized).
    """
    if storage_options is not None:
        set_storage_options(storage_options)
    executor = Executor(pipeline, address=address, store=store, depth=depth,
                        ray_init_kwargs=ray_init_kwargs, _one_shot=True)
    try:
        return executor.iterate(*inputs, ordered=ordered, progress=progress, run_id=run_id,
                                micro_batch=micro_batch, shards=shards,
                                max_active_sources=max_active_sources, quiet=quiet,
                                lease_ttl_s=lease_ttl_s, input_batch_size=input_batch_size,
                                max_active_input_batches=max_active_input_batches,
                                admission_order=admission_order, sink=sink, reuse=reuse,
                                no_reuse=no_reuse, pool_sizing=pool_sizing,
                                pool_budget=pool_budget, metrics_port=metrics_port,
                                metrics_host=metrics_host, identities=identities,
                                indexed=indexed, _one_shot=True)
    except BaseException:
        executor.close()
        raise


class Executor:
    """Keeps a pipeline's actor pools (and the models loaded in them) warm across runs.

    Each :meth:`run` is a separate lineage run in the store; the actors start once (at
    the first run) and serve every run until :meth:`close`. ``Pipeline.run`` is a
    one-shot Executor. ``address``, ``store``, ``depth`` and ``ray_init_kwargs`` are as
    for :func:`run_pipeline`; the other options go to each run.

    >>> with ro.Executor(MyPipeline()) as executor:    # doctest: +SKIP
    ...     first = executor.run([1, 2, 3])             # starts the actors
    ...     second = executor.run([4, 5, 6])            # reuses them
    >>> first.outputs, second.outputs                   # doctest: +SKIP
    """

    def __init__(self, pipeline: Any, *, address: str | None = None, store: str = "memory://",
                 depth: int | None = None, ray_init_kwargs: dict[str, Any] | None = None,
                 _one_shot: bool = False) -> None:
        self.pipeline = pipeline
        self.plan: Plan = pipeline.compile()
        self._name = f"executor-{uuid.uuid4().hex[:8]}"
        # A one-shot Executor (Pipeline.run) has no later run to reuse its values.
        self._pinned = _pin_memory_store(store, self._name, keep_all=not _one_shot)
        self.store_url = store if self._pinned is None else self._pinned.url
        self._address, self._depth, self._ray_init_kwargs = address, depth, ray_init_kwargs
        self._pools: dict[str, Any] | None = None
        self._call_module: dict[Any, str] = {}
        self._active: RunHandle | None = None
        self._closed = False
        self.runs = 0

    def run(self, *inputs: Any, **options: Any) -> RunHandle:
        """Run to the end (one lineage run); the finished handle (``.outputs``, ``.collect()``)."""
        handle = self.iterate(*inputs, **options)
        handle.collect()
        return handle

    def iterate(self, *inputs: Any, ordered: bool = True, progress: bool | None = None,
                run_id: str | None = None, micro_batch: int = 16, shards: int = 1,
                max_active_sources: int | None = 256, quiet: bool = False,
                lease_ttl_s: float = LEASE_TTL_S, input_batch_size: int | None = None,
                max_active_input_batches: int | None = None,
                admission_order: Sequence[int] | None = None,
                sink: FileSink | None = None, reuse: str | None = None,
                no_reuse: Sequence[str] = (), pool_sizing: SizingSettings = DEFAULT_SIZING,
                pool_budget: Mapping[str, float] | None = None,
                metrics_port: int | None = None, metrics_host: str = "127.0.0.1",
                identities: Sequence[str | None] | None = None,
                indexed: Iterable[Row] | None = None,
                _one_shot: bool = False) -> RunHandle:
        """Start one run and return its :class:`RunHandle` to iterate (as ``Pipeline.run``)."""
        from rayorch.runtime.reuse_setup import open_reuse, reuse_config

        if self._closed:
            raise DriverError("this Executor is closed: make a new one")
        if self._active is not None and not self._active._closed:
            raise DriverError("the previous run of this Executor is still open: iterate it "
                              "to the end or close() it before starting another")
        micro_batch, max_active_sources = _upstream_admission(
            micro_batch, max_active_sources, input_batch_size, max_active_input_batches)
        if micro_batch < 1 or shards < 1:
            raise DriverError("micro_batch and shards must be >= 1")
        plan, store = self.plan, self.store_url
        if indexed is None:
            rows, total = zip_inputs(plan, inputs)
            order = checked_order(admission_order, total)
            if identities is not None and len(identities) != total:
                raise DriverError(f"identities has {len(identities)} entries for {total} "
                                  "inputs: give one per input position")
        else:
            check_indexed(inputs, admission_order, ordered, identities)
            rows, total, order = iter(()), None, None
        if sink is not None and run_id is None:
            run_id = sink.run_id
        elif sink is not None and sink.run_id != run_id:
            raise DriverError(f"the sink belongs to run {sink.run_id}, not {run_id}")
        fresh = run_id is None
        run_id = run_id or new_run_id(plan)
        session = DriverSession(store, address=self._address,
                                ray_init_kwargs=self._ray_init_kwargs,
                                metrics_port=metrics_port, metrics_host=metrics_host)
        with session:
            lineage = session.store
            session.start_ray(plan)
            created = fresh
            if not fresh:
                _refuse_finished_run(lineage, run_id, store)
                created = not _run_exists(lineage, run_id)
            reuser = open_reuse(lineage, plan, reuse, no_reuse, run_id=run_id, quiet=quiet)
            info = lineage.open_run(run_id, plan, shards=shards, micro_batch=micro_batch,
                                    config={"max_active_sources": max_active_sources,
                                            **reuse_config(reuser, no_reuse)})
            if sink is not None:  # so `rayorch audit RUN` finds it without --out-dir
                lineage.record_sink(run_id, sink.url, sink.format)
            if indexed is not None:
                pass  # a streamed input: its spec is recorded by whoever streams it
            elif order is not None and len(order) != total:
                print(f"rayorch: run {run_id} will not be resumable with rayorch resume: it "
                      f"runs {len(order)} of its {total} inputs", file=sys.stderr)
            elif is_shared_store(store):
                _record_manifest(lineage, run_id, self.pipeline, inputs, depth=self._depth,
                                 max_active_sources=max_active_sources, identities=identities)
            # The actors start while the driver takes the leases and admits sources.
            pools = self._warm_pools()

        def release(run_done: bool) -> None:
            if _one_shot:
                self.close()
            else:
                for pool in pools.values():
                    pool.settle()

        config = DriverConfig(LeaseMode.HOLD_ALL, lease_ttl_s, micro_batch, max_active_sources,
                              progress=progress, new_run=created, sizing=pool_sizing,
                              pool_budget=pool_budget)
        driver = session.start(run_id=run_id, info=info, plan=plan, driver_id=new_driver_id(),
                               pools=pools, call_module=self._call_module,
                               feed=IteratorFeed(rows, info, total, order, identities)
                               if indexed is None else IteratorFeed.indexed(indexed, info),
                               sink=sink if sink is not None else CallerSink(ordered, order),
                               config=config, release=release, reuse=reuser)
        if not quiet:
            if commits_in_actor(store):
                hint = f"audit with: rayorch audit {run_id} --store {redact_url(store)}"
            else:
                hint = "in-memory lineage: run with store='redis://...' to audit it later"
            print(f"rayorch: run {run_id} ({hint})", file=sys.stderr)
        self.runs += 1
        self._active = RunHandle(driver, store)
        return self._active

    def _warm_pools(self) -> dict[str, Any]:
        if self._pools is None:
            self._pools, self._call_module = build_pools(
                self.plan, self.store_url, self._name, depth=self._depth)
        return self._pools

    @property
    def actors_started(self) -> int:
        """Actors started so far (the first run's, plus replacements of crashed ones)."""
        pools = self._pools or {}
        return sum(len(p.slots) + p.replaced for p in pools.values())

    def close(self) -> None:
        """Stop the open run (if any) and the actors (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._active is not None and not self._active._closed:
            self._active.close()
        for pool in (self._pools or {}).values():
            pool.shutdown()
        self._pools = None
        if self._pinned is not None:
            self._pinned.close()

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pin_memory_store(url: str, name: str, *, keep_all: bool) -> Any:
    """An Executor's memory store, held open so its runs outlive each other (one process:
    a later run can reuse an earlier one); ``memory://`` becomes ``memory://<executor>``.

    With ``keep_all`` its runs keep every value (``keep=all``), so that a later run reuses
    them, unless the URL says otherwise (``memory://NAME?keep=none`` frees a delivered
    source's values)."""
    if not url.startswith("memory://"):
        return None
    from rayorch.store.registry import open_store

    if url == "memory://":
        url = f"memory://{name}"
    if keep_all and "keep=" not in url:
        url += "&keep=all" if "?" in url else "?keep=all"
    return open_store(url)


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
                     *, depth: int | None, max_active_sources: int | None,
                     identities: Sequence[str | None] | None = None) -> None:
    """Make a ``Pipeline.run`` resumable; one line on stderr (never a failure) when it cannot."""
    from rayorch.runtime.manifest import manifest_of_run, record_manifest
    from rayorch.store.records.manifest import ManifestError

    try:
        manifest = manifest_of_run(pipeline, inputs, depth=depth,
                                   max_active_sources=max_active_sources, identities=identities)
    except (ManifestError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        print(f"rayorch: run {run_id} will not be resumable: {reason}", file=sys.stderr)
        return
    record_manifest(lineage, run_id, manifest)

