"""The worker ABI: one Ray actor per pool replica, running batches of one module.

The ABI is value-only. A worker receives a Call spec, the batch's input rows and
``(path, generation)`` tags; it runs the user callable through
:func:`rayorch.core.udf.invoke_batch`, turns each record's result into a
``GrainCommitted`` report, and

* with a shared store (Redis) commits the reports itself, one ``commit`` (one round
  trip) per batch, the store writing large values to its payload directory first;
* with the in-process memory store returns the reports for the driver to commit.

Either way the values travel back to the driver on Ray's object store (the fast
path). A worker knows nothing of the plan. An exception from the user code never leaves
the worker (its recovery policy handles it here); only ``ro.ActorFailure`` does.

A module with ``max_inflight=N`` gets an actor that runs up to N batches at once (Ray's
``max_concurrency``, one thread per batch; an ``async def`` module's coroutines share one
event loop, see :func:`rayorch.core.udf.instantiate`). Each batch is still its own attempt
with its own commit; the commits of one actor go through its store client one at a time.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rayorch.core.facts import (
    GrainCommitted,
)
from rayorch.core.ids import CallId, Path
from rayorch.core.plan import CallSpec, ModuleSpec

STORE_OUTAGE_S = 300.0
"""How long a worker keeps retrying a commit while the lineage store is unreachable."""

GrainTag = tuple[Path, int]
"""``(path, generation)`` of one Grain in a batch."""


@dataclass(frozen=True, slots=True)
class StoreBinding:
    """How a worker reaches the run's lineage store to commit its own reports.

    ``url`` is a shared store (``redis://``); ``run_id`` names the run.
    """

    url: str
    run_id: str
    orphan_grace_s: float | None = None  # shared (detached) actors: leave when orphaned
    # Started while a driver of the run was alive (mid-run: grown, adopted, replaced): the
    # actor need not wait for a first heartbeat to know the run had a driver.
    orphan_driver_seen: bool = False


@dataclass(frozen=True, slots=True)
class BatchTask:
    """One physical batch: the Grains of one Call that share one attempt."""

    call: CallSpec
    tags: tuple[GrainTag, ...]
    rows: tuple[tuple[Any, ...], ...]
    batch_id: int = 0
    run_id: str = ""  # the run it belongs to (a warm Executor's actors serve many runs)


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What a worker hands back for one batch.

    ``reports`` holds one ``GrainCommitted`` per tag (values inline, always: the fast
    path). ``verdicts`` is set when the worker already committed them through the
    store (one verdict code per tag); ``None`` means the driver must commit.
    ``physical_failure`` is set (and ``reports`` empty) when the batch as a whole
    failed in a way that condemns the actor: the UDF raised ``ro.ActorFailure``. Any
    other exception is handled in the actor (records Failed, never the batch).
    """

    batch_id: int
    call: CallId
    tags: tuple[GrainTag, ...]
    reports: tuple[GrainCommitted, ...]
    verdicts: tuple[int, ...] | None
    physical_failure: str | None
    worker_pid: int
    udf_seconds: float
    commit_seconds: float = 0.0
    udf_exceptions: int = 0
    """Exceptions the user code raised in this batch, each handled in this actor."""
    replace_actor: bool = False
    """The UDF raised ``ro.ActorFailure``: the actor must be replaced."""
    rss_bytes: int = 0
    """The actor's resident memory after the batch (0: unknown), for ``max_rss``."""
    tokens: tuple[int, int] = (0, 0)
    """Model tokens (in, out) the module counted during the batch (``actors/usage.py``)."""
    payload_bytes: int = 0
    """Bytes the commit wrote to payload segments."""


def resident_bytes() -> int:
    """This process's resident memory now (Linux ``/proc/self/statm``; psutil elsewhere;
    0 when neither can tell)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # no way to measure is "unknown", not an error
        return 0


class ModuleWorker:
    """The body of a pool actor: builds the user target once, then runs batches.

    Wrapped with ``ray.remote`` by :mod:`rayorch.actors.pool`; plain Python here so
    that it can be exercised (and type-checked) without Ray.
    """

    def __init__(self, module: ModuleSpec, binding: StoreBinding | None,
                 storage: Mapping[str, str] | None = None) -> None:
        from rayorch.core.udf import instantiate

        if storage:  # the driver's --storage-option settings, for inputs and payloads
            from rayorch.storage import set_storage_options

            set_storage_options(storage)

        self._module = module
        self._fn = instantiate(module)
        self._binding = binding
        self._store: Any = None
        self._commit_lock = threading.Lock()  # batches in flight at once share one client
        if binding is not None and binding.orphan_grace_s is not None:
            from rayorch.actors.orphan_watch import start_orphan_watch

            start_orphan_watch(binding.url, binding.run_id, binding.orphan_grace_s,
                               driver_seen=binding.orphan_driver_seen)

    def ping(self) -> int:
        """The worker's process id (also proves the constructor ran)."""
        return os.getpid()

    def run_batch(self, task: BatchTask) -> BatchResult:
        """Run one batch; commit its reports when bound to a shared store.

        An exception from the user code is handled here, in the living actor, by the
        module's recovery policy (:func:`rayorch.core.udf.run_with_recovery`): records
        that raise alone are Failed, their batch-mates are not. Only an
        :class:`~rayorch.core.outcome.ActorFailure` makes the batch a physical failure
        (the pool then replaces this actor).
        """
        from rayorch.actors.usage import take_tokens
        from rayorch.core.outcome import ActorFailure
        from rayorch.core.udf import one_line_cause, reports_for, run_with_recovery
        from rayorch.store.retention import payload_bytes_written

        started = time.perf_counter()
        try:
            done = run_with_recovery(self._fn, self._module.options, task.call, list(task.rows))
        except ActorFailure as exc:
            return BatchResult(
                task.batch_id, task.call.id, task.tags, (), None,
                f"ActorFailure: {one_line_cause(exc).removeprefix('ActorFailure: ')}",
                os.getpid(), time.perf_counter() - started, replace_actor=True,
            )
        udf_seconds = time.perf_counter() - started
        tokens = take_tokens()
        # On a durable store (a binding) any run may be resumed into a file sink: outputs
        # that JSON cannot hold fail their own records here, before the commit.
        reports = tuple(reports_for(task.call.id, task.tags, done.results, time.time(),
                                    json_rule=self._binding is not None))
        rss = resident_bytes()  # for max_rss and the metrics (one read of /proc)
        if self._binding is None:
            return BatchResult(
                task.batch_id, task.call.id, task.tags, reports, None, None, os.getpid(),
                udf_seconds, udf_exceptions=done.exceptions, rss_bytes=rss, tokens=tokens,
            )
        started = time.perf_counter()
        written = payload_bytes_written(self._store) if self._store is not None else 0
        verdicts = self._commit(reports, task.run_id)
        return BatchResult(
            task.batch_id, task.call.id, task.tags, reports, verdicts, None, os.getpid(),
            udf_seconds, time.perf_counter() - started, udf_exceptions=done.exceptions,
            rss_bytes=rss, tokens=tokens,
            payload_bytes=payload_bytes_written(self._store) - written,
        )

    def _commit(self, reports: tuple[GrainCommitted, ...], run_id: str = "") -> tuple[int, ...]:
        """Commit ``reports`` through the shared store (one commit gate call per batch).

        The store writes outputs over its payload threshold to the payload directory
        before the commit; the returned reports keep their values inline for the driver.
        """
        with self._commit_lock:
            return self._commit_locked(reports, run_id)

    def _commit_locked(self, reports: tuple[GrainCommitted, ...], run_id: str) -> tuple[int, ...]:
        if self._store is None:
            assert self._binding is not None
            from rayorch.store.registry import open_store

            self._store = open_store(self._binding.url)
        assert self._binding is not None
        from rayorch.store.errors import StoreUnavailableError
        from rayorch.store.scripts import next_token

        # One token for every attempt: a retry after a lost reply answers ACCEPTED for what
        # the lost attempt committed (and re-commits to the same payload files).
        token = next_token()
        deadline = time.monotonic() + STORE_OUTAGE_S
        delay = 0.2
        told = False
        while True:
            try:
                verdicts = self._store.commit(run_id or self._binding.run_id, reports,
                                              token=token)
            except StoreUnavailableError as exc:
                if time.monotonic() >= deadline:
                    raise
                if not told:  # one line per outage, not one per attempt
                    print(f"rayorch worker {os.getpid()}: {exc}; retrying the commit with "
                          "backoff", file=sys.stderr, flush=True)
                    told = True
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if told:
                print(f"rayorch worker {os.getpid()}: lineage store reachable again",
                      file=sys.stderr, flush=True)
            return tuple(int(v) for v in verdicts)
