"""The store's rules, written once: lease fence, seal check of driver facts, commit gate.

A backend that keeps a shard's lease and Grain table as records it reads and writes
under its own lock or transaction (the memory store; a SQL store under a row lock)
calls these and stores what they return. The Redis stores run the same rules in Lua
(``lua/includes/lease.lua``, ``append-fenced-5.lua``, ``commit-batch-2.lua``), because a
script is Redis's unit of atomicity; the contract suite and
``tests/property/test_store_commit_rule.py`` keep the two equal.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, MutableSet, Sequence
from dataclasses import dataclass

from rayorch.core.commit import commit_verdict
from rayorch.core.facts import Fact, barrier_fact
from rayorch.core.ids import CallId, DomainId, Path, format_grain, parse_path
from rayorch.core.vocabulary import PHASE_AFTER, CommitVerdict, FactKind, GrainPhase
from rayorch.store.errors import (
    FencedError,
    GrainSealedError,
    LeaseHeldError,
    LeaseLostError,
    LeaseRolledBackError,
    StoreRolledBackError,
)
from rayorch.store.layout import AppendBasis, PreparedDriverFact, PreparedReport

GrainEntry = tuple[GrainPhase, int]  # (phase, generation) of one Grain in the store's table

# The table's values as the hot loops use them (no enum lookups per fact).
_SEALED, _ACCEPTED, _OTHER = GrainPhase.SEALED, CommitVerdict.ACCEPTED, int(FactKind.OTHER)
_AFTER: dict[int, GrainPhase] = {int(kind): phase for kind, phase in PHASE_AFTER.items()}
_UNKNOWN: tuple[None, int] = (None, 0)


@dataclass
class Lease:
    driver: str
    epoch: int
    deadline: float  # in the backend's clock


@dataclass
class ShardLease:
    """One shard's lease record: the live lease, the last acquisition, the epoch counter.

    Epochs only go forward: a new holder gets one above every epoch the shard handed out
    and every epoch a caller presented (after a restore, the counter catches up).
    """

    live: Lease | None = None
    last: Lease | None = None  # who continued the shard last (kept after the lease ends)
    counter: int = 0

    def current(self, now: float) -> Lease | None:
        """The live lease, or None (an expired one is dropped)."""
        if self.live is not None and self.live.deadline <= now:
            self.live = None
        return self.live

    def fence(self, run_id: str, shard: int, epoch: int, driver: str, now: float) -> Lease:
        """The live lease if ``driver`` holds it with ``epoch``; else raise why not.

        :class:`LeaseLostError` when the lease lapsed and nobody held the shard since,
        :class:`FencedError` naming who continued it, :class:`LeaseRolledBackError` for an
        epoch the store never handed out (the same rule as ``lua/includes/lease.lua``).
        """
        lease = self.current(now)
        if lease is not None and lease.epoch == epoch and lease.driver == driver:
            return lease
        last = lease or self.last
        last_epoch, last_driver = (last.epoch, last.driver) if last else (self.counter, "")
        mine = last_epoch == epoch and (last is None or last.driver == driver)
        self.counter = max(self.counter, epoch)
        if lease is None and mine:
            raise LeaseLostError(run_id, shard, epoch)
        if last_epoch < epoch:
            raise LeaseRolledBackError(run_id, shard, epoch, last_epoch, last_driver)
        raise FencedError(run_id, shard, epoch, last_epoch, last_driver)

    def acquire(self, run_id: str, shard: int, driver: str, ttl_s: float, now: float, *,
                after_epoch: int | None = None) -> tuple[int, bool]:
        """``(epoch, new)``: the caller's epoch, and whether it is a new holder (a
        ``LeaseAcquired`` fact is then due). See ``LineageStore.acquire_lease``."""
        lease = self.current(now)
        if after_epoch is not None:
            try:
                lease = self.fence(run_id, shard, after_epoch, driver, now)
            except LeaseLostError as exc:
                if type(exc) is not LeaseLostError:
                    raise  # deposed; plain LeaseLostError: nobody held it since
        elif lease is not None and lease.driver != driver:
            raise LeaseHeldError(run_id, shard, lease.driver, lease.epoch)
        if lease is not None:
            lease.deadline = now + ttl_s
            return lease.epoch, False
        self.counter = max(self.counter, self.last.epoch if self.last else 0) + 1
        self.live = self.last = Lease(driver, self.counter, now + ttl_s)
        return self.counter, True

    def release(self, epoch: int, driver: str, now: float) -> None:
        """Give the lease up (nothing happens unless ``driver`` holds it with ``epoch``)."""
        lease = self.current(now)
        if lease is not None and lease.epoch == epoch and lease.driver == driver:
            self.live = None


def split_field(grain: str) -> tuple[CallId, Path]:
    """``"call|path"`` (:func:`~rayorch.store.keys.grain_field`) -> ``(call, path)``."""
    call, _, path = grain.rpartition("|")
    return call, parse_path(path)


def basis_check(run_id: str, shard: int, basis: AppendBasis | None, last_seq: int,
                last_append_first: int, entry: Callable[[str], GrainEntry | None]) -> None:
    """Raise :class:`StoreRolledBackError` unless the shard still holds what ``basis`` rests
    on (the same rule as ``append-fenced-5.lua``).

    ``last_seq`` is the shard's last sequence number, ``last_append_first`` the first seq
    of its latest driver append (one holder appends at a time, so a driver's latest append
    is the shard's latest unless the store lost it).
    """
    if basis is None:
        return
    if last_seq < basis.read_seq:
        raise StoreRolledBackError(run_id, shard, rolled_back_detail(
            READ_GONE, last_seq, basis.read_seq))
    if basis.appended_first and last_append_first != basis.appended_first:
        raise StoreRolledBackError(run_id, shard, rolled_back_detail(
            APPEND_GONE, last_append_first, basis.appended_first))
    gone = [i for i, (field, gen) in enumerate(basis.sealed_fields(), 1)
            if entry(field) != (_SEALED, gen)]
    if gone:
        raise StoreRolledBackError(run_id, shard, rolled_back_detail(
            COMMITS_GONE, *gone, sealed=basis.sealed))


# Why a store refused an append as rolled back (the codes of append-fenced-5.lua's -15).
READ_GONE, APPEND_GONE, COMMITS_GONE = 1, 2, 3


def rolled_back_detail(reason: int, *values: int,
                       sealed: Sequence[tuple[CallId, Path, int]] = ()) -> str:
    """The words of a rolled-back refusal: ``reason`` and its values (seqs, or the
    1-based positions in ``sealed`` of the commits the store no longer holds)."""
    if reason == READ_GONE:
        held, read = values
        return f"it holds facts up to seq {held}, and the driver had read up to {read}"
    if reason == APPEND_GONE:
        held, mine = values
        return (f"the driver's latest append, from seq {mine}, is gone (the store's latest "
                f"starts at seq {held})" if held else
                f"the driver's latest append, from seq {mine}, is gone")
    names = [f"{format_grain((sealed[i - 1][0], sealed[i - 1][1]))} generation "
             f"{sealed[i - 1][2]}" for i in values]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"it no longer holds the accepted commit of {shown}"


def seal_check(run_id: str, shard: int, prepared: Sequence[PreparedDriverFact],
               entry: Callable[[str], GrainEntry | None]) -> dict[str, GrainEntry]:
    """The Grain entries the driver facts leave behind (a later fact sees an earlier one's).

    Raises :class:`GrainSealedError` naming every fact that dispatches, retries or fails
    a sealed Grain; the caller then writes nothing.
    """
    overlay: dict[str, GrainEntry] = {}
    conflicts: list[tuple[CallId, Path]] = []
    for item in prepared:
        if item.kind == _OTHER:
            continue
        current = overlay.get(item.grain) or entry(item.grain)
        if current is not None and current[0] is _SEALED:
            conflicts.append(split_field(item.grain))
        else:
            overlay[item.grain] = (_AFTER[item.kind], item.generation)
    if conflicts:
        raise GrainSealedError(run_id, shard, conflicts)
    return overlay


def judge_reports(prepared: Sequence[PreparedReport], grains: MutableMapping[str, GrainEntry],
                  barriers: MutableSet[str], verdicts: list[CommitVerdict],
                  write: Callable[[DomainId, Fact], object]) -> None:
    """The commit rule (:func:`~rayorch.core.commit.commit_verdict`) over one shard's reports.

    ``grains`` and ``barriers`` are the shard's Grain table and barrier members (or a
    backend's copy of the entries these reports name); they are updated as the reports are
    judged, so a later report sees an earlier one's effect: a duplicate is SEALED, a
    sibling after an accepted ``group_failure`` is BARRED. Each verdict goes to
    ``verdicts[report position]``; an accepted report seals its Grain and is written, then
    its ``BarrierInstalled`` when it installs one.
    """
    get = grains.get
    for item in prepared:
        phase, generation = get(item.grain) or _UNKNOWN
        member = item.barrier
        verdict = commit_verdict(phase, generation, item.generation,
                                 bool(member) and member in barriers)
        verdicts[item.position] = verdict
        if verdict is not _ACCEPTED:
            continue
        grains[item.grain] = (_SEALED, item.generation)
        write(item.domain, item.report)
        if item.installs_barrier:
            barriers.add(member)
            write(item.domain, barrier_fact(item.report))


__all__ = ["GrainEntry", "Lease", "ShardLease", "basis_check", "judge_reports",
           "rolled_back_detail", "seal_check", "split_field"]
