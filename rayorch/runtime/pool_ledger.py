"""The pool ledger: one place per Ray cluster that divides it among runs and their drivers.

Every driver whose pools size themselves reports to the ledger at each decision (one
actor call every ``interval_s``): what its run wants (the resources its pools' work asks
for, the cluster to itself), the loads it measured, and which actors of a shared pool it
still holds. The reply is the run's *budget* (its max-min fair share of the cluster among
the runs that report, :func:`rayorch.core.run_shares.fair_shares`), whether this driver
is the run's *leader*, and, for the leader, the other drivers' loads. So:

* concurrent runs get fair shares: a run holding more than its share gives actors back
  (drains) once another claims, and none is starved;
* the drivers of one run (``rayorch driver`` replicas, which share named actors) have one
  budget and one sizing decision: the leader merges every driver's load per pool
  (:func:`~rayorch.core.run_shares.merge_loads`), decides, and publishes each shared pool's
  *live* actor indexes here; the other drivers adopt them at their next report (start the
  new actors by name, drain the dropped ones). A dropped actor is killed by the leader only
  once every live driver has adopted the change and holds no batch on it.

Its state is soft: a driver that stops reporting drops out after ``ttl_s``; a restarted
ledger learns the live sets back from the drivers' reports. The Ray actor is named
``rayorch:pool-ledger`` in the ``rayorch`` namespace, needs no CPU, and leaves by itself
when nobody has reported for ``IDLE_EXIT_S``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rayorch.actors.pool import SHARED_NAMESPACE
from rayorch.core.pool_sizing import StageLoad
from rayorch.core.run_shares import fair_shares, leader

LEDGER_NAME = "rayorch:pool-ledger"
LEDGER_NAMESPACE = SHARED_NAMESPACE  # with the shared pools' actors
CLAIM_TTL_S = 20.0
"""A driver that has not reported for this long no longer claims (4 default intervals)."""
IDLE_EXIT_S = 600.0
CALL_TIMEOUT_S = 1.0
"""How long a driver's loop waits for the ledger's answer to a resize (a lease TTL is seconds:
a report never waits, its reply is read at a later decision)."""
STALE_S = 30.0
"""A report unanswered this long: the ledger is stuck; the driver sizes alone, asks again."""


@dataclass(frozen=True, slots=True)
class LedgerReply:
    """What a driver learns at a report (see the module docstring)."""

    budget: dict[str, float]
    leader: bool
    peers: tuple[StageLoad, ...] = ()
    """The other live drivers' loads (the leader's only)."""
    live: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Each shared pool's live actor indexes (the run's pools that are shared)."""
    version: int = 0
    """Of the live sets: a driver reports the version it adopted."""
    retire: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Dropped actors no live driver holds any more (the leader kills them)."""
    runs: int = 1
    """Runs claiming the cluster now."""


class SharedPools(Protocol):
    """What the ledger asks of a pools port whose pools the run's drivers share."""

    version: int
    """The version of the live sets it follows."""

    def held(self) -> dict[str, list[int]]:
        """Each shared pool's actor indexes this driver still has (live or draining)."""
        ...

    def adopt(self, live: Mapping[str, Sequence[int]], version: int) -> None:
        """Start the live actors it lacks (by name), drain the ones no longer live."""
        ...

    def kill_dropped(self, module: str, indexes: Sequence[int]) -> None:
        """Kill dropped actors by name (every driver has let go of them)."""
        ...


@dataclass
class _Claim:
    run: str
    wants: dict[str, float]
    loads: tuple[StageLoad, ...]
    held: dict[str, tuple[int, ...]]
    version: int
    seen: float


@dataclass
class _SharedPools:
    live: dict[str, list[int]] = field(default_factory=dict)
    next_index: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, dict[int, int]] = field(default_factory=dict)  # index -> at version
    version: int = 0


_RAY_BOOKKEEPING = ("memory", "object_store_memory")


def claimable(resource: str) -> bool:
    """Whether runs claim ``resource``: not Ray's own memory, node and placement-group keys."""
    return not (resource in _RAY_BOOKKEEPING or resource.startswith(("node:", "accelerator_type:"))
                or "_group_" in resource)


class PoolLedgerState:
    """The ledger's state and rules, without Ray (the actor wraps one; tests use it
    directly with their own clock)."""

    def __init__(self, *, ttl_s: float = CLAIM_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self._clock = ttl_s, clock
        self.claims: dict[tuple[str, str], _Claim] = {}
        self.shared: dict[str, _SharedPools] = {}
        self.leaders: dict[str, str] = {}  # run -> the driver that sizes its pools
        self.capacity: dict[str, float] = {}
        self.last_call = clock()

    def _expire(self, now: float) -> None:
        for key in [k for k, c in self.claims.items() if now - c.seen > self.ttl_s]:
            del self.claims[key]
        claiming = {run for run, _ in self.claims}
        for run in [r for r in self.shared if r not in claiming]:
            del self.shared[run]
        for run in [r for r in self.leaders if r not in claiming]:
            del self.leaders[run]

    def drivers(self, run_id: str) -> list[str]:
        return sorted(d for r, d in self.claims if r == run_id)

    def report(self, run_id: str, driver_id: str, *, capacity: Mapping[str, float],
               wants: Mapping[str, float], loads: Sequence[StageLoad] = (),
               held: Mapping[str, Sequence[int]] | None = None, version: int = 0) -> LedgerReply:
        """Record one driver's claim and answer it (see :class:`LedgerReply`). ``held``:
        for each shared pool, the actor indexes the driver still has (live or draining);
        None: the run's pools are private."""
        now = self._clock()
        self.last_call = now
        self.capacity = {k: float(v) for k, v in capacity.items()}
        self._expire(now)
        held_now = {m: tuple(ix) for m, ix in (held or {}).items()}
        self.claims[(run_id, driver_id)] = _Claim(run_id, dict(wants), tuple(loads), held_now,
                                                  version, now)
        run_wants: dict[str, dict[str, float]] = {}
        for claim in self.claims.values():
            total = run_wants.setdefault(claim.run, {})
            for key, amount in claim.wants.items():
                total[key] = total.get(key, 0.0) + amount
        budget = fair_shares(self.capacity, run_wants)[run_id]
        lead = leader(self.drivers(run_id), self.leaders.get(run_id))
        self.leaders[run_id] = lead or driver_id
        leads = lead == driver_id
        pools = None
        if held is not None:
            pools = self.shared.setdefault(run_id, _SharedPools())
            for module, indexes in held_now.items():  # a restarted ledger learns them back
                if module not in pools.live:
                    pools.live[module] = sorted(indexes)
                    pools.next_index[module] = max(indexes, default=-1) + 1
                else:
                    top = max(indexes, default=-1) + 1
                    pools.next_index[module] = max(pools.next_index[module], top)
        peers = tuple(load for (run, d), c in sorted(self.claims.items())
                      if run == run_id and d != driver_id for load in c.loads) if leads else ()
        if pools is None:
            return LedgerReply(budget, leads, peers, runs=len(run_wants))
        return LedgerReply(budget, leads, peers,
                           {m: tuple(ix) for m, ix in pools.live.items()}, pools.version,
                           self._retirable(run_id, pools) if leads else {}, len(run_wants))

    def _retirable(self, run_id: str, pools: _SharedPools) -> dict[str, tuple[int, ...]]:
        """Dropped indexes that every live driver has let go of, since adopting the drop."""
        claims = [c for (run, _), c in self.claims.items() if run == run_id]
        out: dict[str, tuple[int, ...]] = {}
        for module, dropped in pools.dropped.items():
            free = [i for i, at in sorted(dropped.items())
                    if all(c.version >= at and i not in c.held.get(module, ()) for c in claims)]
            if free:
                out[module] = tuple(free)
        return out

    def resize(self, run_id: str, module: str, size: int,
               drop_first: Sequence[int] = ()) -> tuple[tuple[int, ...], int]:
        """Set a shared pool's size: new actors get fresh indexes, a shrink drops those in
        ``drop_first`` order, then the newest. Its live indexes and the new version."""
        self.last_call = self._clock()
        pools = self.shared.setdefault(run_id, _SharedPools())
        live = pools.live.setdefault(module, [])
        nxt = pools.next_index.get(module, max(live, default=-1) + 1)
        size = max(1, size)
        if size == len(live):
            return tuple(live), pools.version
        pools.version += 1
        if size > len(live):
            live.extend(range(nxt, nxt + size - len(live)))
            pools.next_index[module] = max(nxt, max(live) + 1)
        else:
            order = [i for i in drop_first if i in live] + sorted(live, reverse=True)
            dropped = pools.dropped.setdefault(module, {})
            for index in list(dict.fromkeys(order))[: len(live) - size]:
                live.remove(index)
                dropped[index] = pools.version
        return tuple(live), pools.version

    def live(self, run_id: str) -> dict[str, tuple[int, ...]]:
        """The run's shared pools' live actor indexes (a joining driver builds these)."""
        self._expire(self._clock())
        pools = self.shared.get(run_id)
        return {} if pools is None else {m: tuple(ix) for m, ix in pools.live.items() if ix}

    def retired(self, run_id: str, module: str, indexes: Sequence[int]) -> None:
        """The leader killed these dropped actors."""
        pools = self.shared.get(run_id)
        if pools is not None:
            for index in indexes:
                pools.dropped.get(module, {}).pop(index, None)

    def leave(self, run_id: str, driver_id: str) -> None:
        self.claims.pop((run_id, driver_id), None)
        self._expire(self._clock())

    def idle_s(self) -> float:
        return self._clock() - self.last_call if not self.claims else 0.0


class PoolLedgerActor(PoolLedgerState):
    """The Ray actor: one :class:`PoolLedgerState` and a thread that ends the process once
    nobody has reported for ``IDLE_EXIT_S``."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        threading.Thread(target=self._exit_when_idle, name="rayorch-ledger-idle",
                         daemon=True).start()

    def _exit_when_idle(self) -> None:
        while True:
            time.sleep(30.0)
            with self._lock:
                if self.idle_s() > IDLE_EXIT_S:
                    os._exit(0)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        if method not in ("report", "resize", "retired", "leave", "live"):
            raise ValueError(f"pool ledger: no method {method!r}")
        with self._lock:
            return getattr(self, method)(*args, **kwargs)


class RayLedger:
    """A driver's side of the ledger on Ray. A report never blocks the driver's loop (its
    leases renew in the same loop): it is sent, and its reply is read at a later decision
    (the sizer acts on the latest reply). A resize waits ``CALL_TIMEOUT_S`` at most. An
    unreachable ledger is said once and the driver sizes alone meanwhile (a driver whose pools
    are shared only follows until the ledger has answered)."""

    def __init__(self, run_id: str, driver_id: str, *, log: Callable[[str], None]) -> None:
        self.run_id, self.driver_id, self._log = run_id, driver_id, log
        self._actor: Any = None
        self._said = False
        self._shared: SharedPools | None = None
        self._pending: Any = None  # the report sent and not answered yet
        self._sent_at = 0.0
        self._reply: LedgerReply | None = None
        self._capacity: dict[str, float] | None = None

    def _handle(self) -> Any:
        import ray

        if self._actor is None:
            remote = ray.remote(num_cpus=0, max_restarts=0)(PoolLedgerActor)
            self._actor = remote.options(name=LEDGER_NAME, namespace=LEDGER_NAMESPACE,
                                         lifetime="detached", get_if_exists=True).remote()
        return self._actor

    def _failed(self, exc: BaseException) -> None:
        self._actor = None  # the ledger died or is stuck: next time a fresh handle
        if not self._said:
            self._said = True
            text = str(exc).splitlines()[0] if str(exc) else ""
            self._log(f"rayorch: pool ledger unreachable ({type(exc).__name__}: {text}); this "
                      "driver sizes its pools alone until it answers")

    def _answered(self) -> None:
        if self._said:
            self._said = False
            self._log("rayorch: pool ledger answers again")

    def _call(self, method: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S,
              **kwargs: Any) -> Any:
        import ray

        try:
            result = ray.get(self._handle().call.remote(method, *args, **kwargs),
                             timeout=timeout_s)
        except Exception as exc:
            self._failed(exc)
            return None
        self._answered()
        return result

    def capacity(self) -> dict[str, float]:
        """The cluster's resources an actor may ask for: CPU, GPU and custom ones (not Ray's
        memory, node and placement-group bookkeeping), as read for the latest report (one
        read a decision)."""
        if self._capacity is None:
            self._capacity = self._read_capacity()
        return self._capacity

    @staticmethod
    def _read_capacity() -> dict[str, float]:
        import ray

        return {k: float(v) for k, v in ray.cluster_resources().items()  # type: ignore[no-untyped-call]
                if claimable(k)}

    def report(self, wants: Mapping[str, float], loads: Sequence[StageLoad]
               ) -> LedgerReply | None:
        """Claim ``wants`` for the run with this driver's ``loads`` (sent, not waited for);
        the latest reply: the shared pools of the attached port (:meth:`attach`) follow its
        live sets, and the leader kills the actors every driver has let go of. None while
        none came and the pools are private (the driver sizes alone)."""
        import ray

        shared = self._shared
        if self._pending is not None:
            done, _ = ray.wait([self._pending], timeout=0)
            if done:
                ref, self._pending = self._pending, None
                try:
                    got = ray.get(ref)
                except Exception as exc:
                    self._failed(exc)
                    got = None
                if isinstance(got, LedgerReply):
                    self._answered()
                    self._reply = got
                    self._follow(got)
            elif time.monotonic() - self._sent_at > STALE_S:
                self._failed(TimeoutError(f"no answer in {STALE_S:g}s"))
                self._pending = None
        self._capacity = self._read_capacity()
        if self._pending is None:
            try:
                self._pending = self._handle().call.remote(
                    "report", self.run_id, self.driver_id, capacity=self._capacity,
                    wants=dict(wants), loads=tuple(loads),
                    held=None if shared is None else shared.held(),
                    version=0 if shared is None else shared.version)
                self._sent_at = time.monotonic()
            except Exception as exc:
                self._failed(exc)
        if self._reply is None and shared is not None:
            return LedgerReply({}, leader=False)  # shared pools: follow until it answers
        return self._reply

    def _follow(self, reply: LedgerReply) -> None:
        shared = self._shared
        if shared is None:
            return
        shared.adopt(reply.live, reply.version)
        for module, indexes in reply.retire.items():
            shared.kill_dropped(module, indexes)
            with contextlib.suppress(Exception):  # not waited for: a retry is harmless
                self._handle().call.remote("retired", self.run_id, module, list(indexes))

    def attach(self, shared: SharedPools) -> None:
        """The port whose shared pools follow this run's live sets."""
        self._shared = shared

    def resize(self, module: str, size: int, drop_first: Sequence[int]
               ) -> tuple[tuple[int, ...], int] | None:
        answer = self._call("resize", self.run_id, module, size, list(drop_first))
        return None if answer is None else (tuple(answer[0]), int(answer[1]))

    def live(self) -> dict[str, tuple[int, ...]]:
        """The run's shared pools' live sets (before the driver's loop: the ledger may be
        starting, so this waits longer)."""
        answer = self._call("live", self.run_id, timeout_s=10.0)
        return dict(answer) if isinstance(answer, dict) else {}

    def leave(self) -> None:
        with contextlib.suppress(Exception):
            self._call("leave", self.run_id, self.driver_id)


__all__ = ["CLAIM_TTL_S", "LEDGER_NAME", "LedgerReply", "PoolLedgerActor", "PoolLedgerState",
           "RayLedger", "SharedPools", "claimable"]
