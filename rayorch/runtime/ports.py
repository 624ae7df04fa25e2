"""The driver shell's ports: what it asks of the pools and the sink (the fact log is the store).

The one driver (:class:`~rayorch.runtime.shard_driver.ShardDriver`) is a loop that hands
each instruction of its shard machines to a port and feeds each port's completion back as
an event (docs/ARCHITECTURE.md, "One driver"):

* the **fact log** — a :class:`~rayorch.store.base.LineageStore`: fenced append of the
  machines' facts, ``iter_facts`` for a rebuild, ``commit`` for reports a worker did not
  commit itself (the store's commit gate is the one commit rule);
* the **pools** — :class:`Pools`: a slot for a batch of a Call, send it, collect what
  finished as :class:`Completion`\\ s;
* the **sink** — :class:`Sink` (a file sink, or a collecting one) or the caller's
  iterator (:class:`~rayorch.runtime.delivery.CallerSink`).

Three pools ports exist: Ray actors (:mod:`rayorch.runtime.ray_pools`), in-process
actors for the property tests (:mod:`rayorch.runtime.in_process`) and virtual-clock
actors for the simulator (``bench/simulator``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rayorch.core.facts import GrainCommitted
from rayorch.core.ids import CallId
from rayorch.core.machine import GrainTag, OutputDelivered, OutputReady
from rayorch.core.plan import CallSpec, ModuleSpec, Plan, Policy
from rayorch.core.pool_sizing import StageLoad
from rayorch.runtime.pool_ledger import LedgerReply


@dataclass(frozen=True, slots=True)
class Completion:
    """A batch the pools finished: its reports (and verdicts), or a physical failure."""

    handle: int  # what :meth:`Pools.submit` returned
    call: CallId
    tags: tuple[GrainTag, ...]
    reports: tuple[GrainCommitted, ...] = ()
    verdicts: tuple[int, ...] | None = None  # None: the shell commits through the store
    failure: str | None = None  # set (and ``reports`` empty) when the batch failed physically
    busy_s: float | None = None  # how long the batch ran on its actor (None: not measured)
    crashed: bool = False  # the actor died under the batch (not its own timeout/ActorFailure)
    commit_s: float | None = None  # the actor's store commit (None: the shell commits)
    rss_bytes: int = 0  # the actor's resident memory after the batch (0: unknown)
    actor: int | None = None  # the actor's process id
    tokens: tuple[int, int] = (0, 0)  # model tokens (in, out) the batch's module counted
    payload_bytes: int = 0  # bytes its commit wrote to payload segments


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """How one pool's actors stand now (:meth:`Pools.counts`)."""

    size: int  # actors that take batches, up or starting (draining ones not counted)
    starting: int  # of those, not up yet
    draining: int  # told to take no new batch; they leave once their batches are back
    idle: int  # not draining, with no batch (starting ones too: nothing waits for them)
    in_flight: int  # Grains on the pool's actors
    need: dict[str, float]  # what one actor holds ({"CPU": 1.0, "GPU": 1.0, ...})
    start_s: float | None = None  # how long its actors took to start, lately
    resizable: bool = True  # False: the pool keeps its size (a pool shared by drivers)
    cap: int | None = None  # the most it may have now (an added actor failed to build)


class Pools(Protocol):
    """Where batches run."""

    def batch_limit(self, call: CallId) -> int:
        """The most Grains one batch of ``call`` takes (the module's ``batch_size``)."""
        ...

    def one_parent(self, call: CallId) -> bool:
        """Whether a batch of ``call`` holds the children of one parent only."""
        ...

    def reserve(self, call: CallId) -> Any | None:
        """A slot for one batch of ``call`` now, or None (every actor is busy or starting)."""
        ...

    def unreserve(self, call: CallId, slot: Any) -> None:
        """Give back a slot :meth:`reserve` handed out (no batch after all)."""
        ...

    def idle(self, call: CallId, slot: Any) -> bool:
        """Whether the reserved ``slot``'s actor holds nothing else (no batch, no promise)."""
        ...

    def submit(self, slot: Any, call: CallSpec, tags: tuple[GrainTag, ...],
               rows: tuple[tuple[Any, ...], ...], alone: bool = False) -> int:
        """Send one batch on ``slot``; the handle its :class:`Completion` will carry.
        ``alone``: the actor takes no other batch until this one is back (a crash retry)."""
        ...

    def busy(self) -> bool:
        """Whether a batch is in flight or an actor is starting (:meth:`collect` has work)."""
        ...

    def collect(self) -> list[Completion]:
        """Wait (briefly) for batches to finish; those that did, in the order they did."""
        ...

    def replaced(self) -> int:
        """Actors replaced so far (crashes, timeouts)."""
        ...

    def recycled(self) -> list[tuple[str, str]]:
        """``(module, why)`` of each actor recycled (``max_rss``, ``max_batches``) since the
        last call."""
        ...

    # -- sizing (docs/topics/POOL-SIZING.md, "Pools that size themselves") -----------------------
    def counts(self) -> dict[str, PoolCounts]:
        """Each pool's actors now, by module name."""
        ...

    def free(self) -> dict[str, float]:
        """Resources no one holds now, that a new actor could take."""
        ...

    def resize(self, module: str, size: int) -> None:
        """Start actors up to ``size``, or drain the surplus: a draining actor takes no new
        batch and leaves once its batches are back, so none leaves with one in flight."""
        ...


class Ledger(Protocol):
    """Where a driver's pool sizer claims its run's share of the cluster
    (:mod:`rayorch.runtime.pool_ledger`); without one a driver sizes alone."""

    def capacity(self) -> dict[str, float]:
        """Every resource of the cluster (held or free)."""
        ...

    def report(self, wants: Mapping[str, float], loads: Sequence[StageLoad]
               ) -> LedgerReply | None:
        """Claim what the run wants, with this driver's loads: the run's budget, whether
        this driver sizes the run's pools, the other drivers' loads (None: no answer)."""
        ...


class ModulePools:
    """What the in-process pools ports share: each Call's module, its batch size and policy."""

    def __init__(self, plan: Plan) -> None:
        self._modules: dict[CallId, ModuleSpec] = {}
        self._specs: dict[CallId, CallSpec] = {}
        self._calls_of: dict[str, list[CallId]] = {}  # module name -> its Calls
        for node in plan.calls:
            assert node.call is not None
            self._modules[node.call.id] = plan.module(node.call.module)
            self._specs[node.call.id] = node.call
            self._calls_of.setdefault(node.call.module, []).append(node.call.id)

    def batch_limit(self, call: CallId) -> int:
        return self._modules[call].options.batch_size

    def one_parent(self, call: CallId) -> bool:
        return self._modules[call].options.policy is Policy.PARENT_BOUND

    def idle(self, call: CallId, slot: Any) -> bool:
        """An actor that holds one batch at a time is idle once reserved (the executor's)."""
        return True

    def recycled(self) -> list[tuple[str, str]]:
        """In-process actors hold no native memory of their own: none is recycled."""
        return []


class Sink(Protocol):
    """Where finished sources go when the shell delivers them itself (not the caller)."""

    def reset(self, shard: int) -> None:
        """``shard`` was (re)built from the store: forget what was read of its deliveries."""
        ...

    def deliver(self, shard: int, ready: Sequence[OutputReady], *, acked: int = 0
                ) -> list[OutputDelivered]:
        """Deliver ``ready`` durably (or adopt what is delivered already); one event each.

        ``acked``: how many of the shard's facts the store has acknowledged (a file sink
        records it for the audit's rollback check)."""
        ...

    def discard(self, delivered: Sequence[OutputDelivered]) -> None:
        """Undo :meth:`deliver`: its facts were refused (this driver lost the shard)."""
        ...

    def spooled(self, shard: int) -> int:
        """How many of ``shard``'s outputs :meth:`deliver` took without delivering them yet
        (they wait for a part of their size: ``FileSink(shard_size=...)``)."""
        ...

    def seal(self, shard: int, *, acked: int = 0) -> list[OutputDelivered]:
        """Deliver what :meth:`spooled` counts (``shard`` has nothing more to deliver)."""
        ...


def actor_need(module: ModuleSpec) -> dict[str, float]:
    """What one actor of ``module`` holds: its CPUs, GPUs and custom resources."""
    o = module.options
    need = {"CPU": o.num_cpus, "GPU": o.num_gpus, **dict(o.resources)}
    return {key: amount for key, amount in need.items() if amount}


__all__ = ["Completion", "Ledger", "ModulePools", "PoolCounts", "Pools", "Sink", "actor_need"]
