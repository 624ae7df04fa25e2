"""The driver: runs a compiled Plan on Ray actor pools, with the lineage in a store.

``run_pipeline`` (behind ``Pipeline.run``) compiles the program, opens the run in
the lineage store, leases its shards, builds one actor pool per module and returns
a :class:`RunHandle`. Iterating the handle drives :class:`DriverLoop`:

1. admit source items in micro-batches while the kernel allows (bounded active sources);
2. ask the kernel for batches per Call (its policy), append ``GrainDispatched`` and
   submit them to free actors (up to ``depth`` batches queued per actor);
3. ``ray.wait`` for finished batches; commit them (the memory store in-process, a
   shared store already did it inside the actor) and fold accepted reports into the kernel;
   turn physical failures into the kernel's ``GrainRetried``/``GrainFailed`` facts;
4. hand finished source items back as ``(index, value)``.

The kernel is the single source of scheduling truth; the store gets every fact the
kernel folds, in the order the driver folds them.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.plan import Plan
from rayorch.runtime.loop import DriverLoop
from rayorch.runtime.session import LEASE_TTL_S, RunSession, RunSettings, open_session
from rayorch.store.base import SHARED_STORE_SCHEMES

__all__ = ["DriverError", "ReplicaHandle", "RunHandle", "create_run", "join_run", "run_pipeline"]


class DriverError(RayorchError):
    """The driver was given inputs or options it cannot run."""


class RunHandle:
    """An iterator of ``(index, value)`` per source item, as parents complete.

    ``value`` is the output (a tuple for several outputs) or a
    :class:`~rayorch.core.outcome.FailedResult` when it is not Present.
    With ``ordered=True`` items come back in source order.

    >>> handle = MyPipeline().run(["a.pdf", "b.pdf"])      # doctest: +SKIP
    >>> print(handle.run_id)                                # doctest: +SKIP
    >>> docs = handle.collect()                             # doctest: +SKIP
    """

    def __init__(self, loop: DriverLoop, ordered: bool) -> None:
        self._loop = loop
        self._ordered = ordered
        self._results = self._iterate()
        self._closed = False

    @property
    def run_id(self) -> str:
        return self._loop.session.run_id

    @property
    def store_url(self) -> str:
        return self._loop.session.store_url

    @property
    def store(self) -> Any:
        """The run's :class:`~rayorch.store.base.LineageStore` (e.g. for ``audit_run``)."""
        return self._loop.session.store

    @property
    def stats(self) -> Any:
        """Live counters of the run (:class:`rayorch.progress.RunStats`)."""
        return self._loop.stats

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self

    def __next__(self) -> tuple[int, Any]:
        return next(self._results)

    def _iterate(self) -> Generator[tuple[int, Any], None, None]:
        waiting: dict[int, Any] = {}
        next_index = 0
        try:
            for index, value in self._loop.results():
                if not self._ordered:
                    yield index, value
                    continue
                waiting[index] = value
                while next_index in waiting:
                    yield next_index, waiting.pop(next_index)
                    next_index += 1
            for index in sorted(waiting):
                yield index, waiting.pop(index)
        finally:
            self._release()

    def collect(self) -> list[Any]:
        """Run to the end; the values in source order (``FailedResult`` where not Present)."""
        pairs = sorted(self, key=lambda pair: pair[0])
        return [value for _, value in pairs]

    def close(self) -> None:
        """Stop the run (also mid-way): kill its actors, release its leases (idempotent)."""
        self._results.close()
        self._release()

    def _release(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.close()

    def __enter__(self) -> RunHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: no one to tell
            self.close()


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
) -> RunHandle:
    """Run ``pipeline`` over ``inputs`` (one iterable per ``forward`` argument).

    * ``store``: ``"memory://"`` (in-process, the default) or ``"redis://host:port/db"``.
    * ``ordered``: yield in source order (otherwise as parents complete).
    * ``progress``: live table; ``None`` = on when stdout is a terminal.
    * ``address``: a Ray cluster to join; without it a local Ray is started if needed.
    * ``run_id``: name of the run in the store (default: a fresh id, printed to stderr).
    * ``micro_batch``: sources admitted together (and the shard granule);
      ``shards``: lineage-store shards; ``max_active_sources``: admitted but unfinished
      sources at most (``None`` = unbounded); ``depth``: batches queued per actor;
      ``lease_ttl_s``: the shard leases' TTL (how soon ``rayorch resume`` can take over).

    On a shared store (``redis://``, ``rediss://``, ``redis+cluster://``) the run records a
    manifest (the pipeline's import path and constructor arguments, every source), so that
    ``rayorch resume RUN --store URL`` continues it if this process dies; when it
    cannot (a class in ``__main__``, generator inputs, un-msgpack-able values) one line
    on stderr says why, and the run goes on.
    """
    if micro_batch < 1 or shards < 1:
        raise DriverError("micro_batch and shards must be >= 1")
    plan = pipeline.compile()
    rows, total = _zip_inputs(plan, inputs)
    run_id = run_id or f"{plan.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    settings = RunSettings(
        micro_batch=micro_batch,
        shards=shards,
        max_active_sources=max_active_sources,
        depth=depth,
        progress=progress,
        lease_ttl_s=lease_ttl_s,
    )
    session: RunSession = open_session(plan, store, run_id, settings, address=address)
    if store.lower().startswith(SHARED_STORE_SCHEMES):
        _record_manifest(session, pipeline, inputs, settings)
    if not quiet:
        if session.commits_in_actor:
            hint = f"audit with: rayorch audit {session.run_id} --store {session.public_store_url}"
        else:
            hint = "in-memory lineage: run with store='redis://...' to audit it later"
        print(f"rayorch: run {session.run_id} ({hint})", file=sys.stderr)
    loop = DriverLoop(session, plan, rows, total, settings)
    return RunHandle(loop, ordered)



def _record_manifest(session: RunSession, pipeline: Any, inputs: Sequence[Iterable[Any]],
                     settings: RunSettings) -> None:
    """Make a ``Pipeline.run`` resumable; one line on stderr (never a failure) when it cannot."""
    from rayorch.runtime.manifest import ManifestError, manifest_of_run

    try:
        manifest = manifest_of_run(pipeline, inputs, depth=settings.depth,
                                   max_active_sources=settings.max_active_sources)
    except (ManifestError, ValueError) as exc:
        reason = " ".join(str(exc).split())
        print(f"rayorch: run {session.run_id} will not be resumable: {reason}", file=sys.stderr)
        return
    session.store.save_manifest(session.run_id, manifest.encode())


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
    micro_batch: int = 16,
    shards: int = 4,
    max_active_sources: int | None = 256,
    depth: int | None = None,
) -> str:
    """Create a run that any number of drivers can run (:func:`join_run`, ``rayorch driver``).

    ``pipeline`` is an importable ``ro.Pipeline`` class (or ``"pkg.module:Class"``) built
    with ``args``/``kwargs`` by every driver; ``inputs`` (one iterable per ``forward``
    argument) are recorded in full with the run; each finished source is written to
    ``out_dir/<index>.msgpack``. Returns the run id. Nothing runs until a driver joins.
    """
    from rayorch.runtime.manifest import (
        RunManifest,
        check_storable,
        import_path,
        pipeline_path,
    )
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
    run_id = run_id or f"{plan.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    manifest = RunManifest(path, tuple(args), kwargs, tuple(rows),
                           None if out_dir is None else str(out_dir), max_active_sources, depth)
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
    """One driver replica on a run: an iterator of the ``(index, value)`` it emitted.

    Iterate it (or call :meth:`wait`) to drive; it returns when every shard of the run
    is done, whichever driver did the work. ``.stats`` counts this driver's part.
    """

    def __init__(self, driver: Any) -> None:
        self._driver = driver
        self._results: Generator[tuple[int, Any], None, None] = driver.results()

    @property
    def run_id(self) -> str:
        return str(self._driver.run_id)

    @property
    def driver_id(self) -> str:
        return str(self._driver.driver_id)

    @property
    def stats(self) -> Any:
        """:class:`rayorch.runtime.replica_state.ReplicaStats` of this driver."""
        return self._driver.stats

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self

    def __next__(self) -> tuple[int, Any]:
        return next(self._results)

    def wait(self) -> int:
        """Drive until the run is complete; how many outputs this driver emitted."""
        return sum(1 for _ in self)

    def close(self) -> None:
        """Leave the run (the other drivers, or a later one, take its shards over)."""
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
) -> ReplicaHandle:
    """Join ``run_id`` (made by :func:`create_run`) as one more driver; see :class:`ReplicaHandle`.

    Starting one driver on a run whose drivers all died resumes it. Outputs go to the
    run's output directory (``create_run(out_dir=)``); a run that records none (one made
    by ``Pipeline.run``) writes this driver's outputs to ``out_dir`` when given.
    """
    from rayorch.runtime.replica import REPLICA_LEASE_TTL_S, ReplicaDriver

    log = (lambda line: None) if quiet else None
    driver = ReplicaDriver(store, run_id, driver_id=driver_id, address=address,
                           lease_ttl_s=lease_ttl_s or REPLICA_LEASE_TTL_S, log=log,
                           out_dir=out_dir)
    if not quiet:
        print(f"rayorch: driver {driver.driver_id} joined run {run_id}", file=sys.stderr)
    return ReplicaHandle(driver)
