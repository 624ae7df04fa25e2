"""Per-Call ready queues and the two reservation policies (docs/ARCHITECTURE.md, "Semantics" 6).

Each Call has a FIFO of Grains in the order they became ready and a recovery queue
(Grains sent back by a physical failure) that is served first. Entries are removed
lazily, so a dispatch, a suppression or a seal never has to search a queue: a FIFO
entry is live while its Grain is ``READY`` at generation 0 (a retried Grain is never
served from the FIFO again); a recovery entry ``(grain, generation, limit, alone)`` is live
while the Grain is ``READY`` at that generation.

* ``elastic``: up to ``B`` live Grains from the FIFO head, whatever their parent; O(B).
* ``parent_bound``: up to ``B`` live siblings of the head Grain's parent, in ready order
  (a per-parent FIFO makes this O(B) as well).
* A retried Grain goes in a batch of at most its retry's ``limit`` (1 unless a crash split
  the batch: core/crash_split.py), with retried Grains only; a crash retry (``alone``)
  waits for an actor with nothing else on it. A record that poisons every batch it is in
  can then only exhaust its own attempts, never its batch-mates'.
"""


from __future__ import annotations

from collections import deque

from rayorch.core.ids import CallId, GrainKey, Path
from rayorch.core.plan import Policy
from rayorch.core.vocabulary import READY

RecoveryEntry = tuple[GrainKey, int, int, bool]  # grain, generation, batch limit, alone

# The kernel's ``_phase`` table holds GrainPhase values (rayorch.core.vocabulary) as plain
# ints; a Grain with no entry is waiting, or was decided without running. The queues read
# the table; the kernel writes it.


class CallQueue:
    """The ready and recovery queues of one Call."""

    __slots__ = ("by_parent", "call_id", "fifo", "generation", "parent_bound", "phase", "recovery")

    def __init__(
        self,
        call_id: CallId,
        policy: Policy,
        phase: dict[GrainKey, int],
        generation: dict[GrainKey, int],
    ) -> None:
        self.call_id = call_id
        self.parent_bound = policy is Policy.PARENT_BOUND
        # the kernel's tables, shared and only read here; generation holds only values > 0
        self.phase = phase
        self.generation = generation
        self.fifo: deque[GrainKey] = deque()
        self.recovery: deque[RecoveryEntry] = deque()
        self.by_parent: dict[Path, deque[GrainKey]] = {}

    def push(self, grain: GrainKey) -> None:
        """``grain`` became ready: append it to the FIFO."""
        self.fifo.append(grain)
        if self.parent_bound:
            parent = grain[1][:-1]
            queue = self.by_parent.get(parent)
            if queue is None:
                queue = self.by_parent[parent] = deque()
            queue.append(grain)

    def push_recovery(self, grain: GrainKey, generation: int, limit: int = 1,
                      alone: bool = False) -> None:
        """``grain`` is ready again, as attempt ``generation``, after a physical failure: in a
        batch of at most ``limit`` retried Grains, on an idle actor when ``alone``."""
        self.recovery.append((grain, generation, limit, alone))

    def _recovery_head(self) -> RecoveryEntry | None:
        """The first live recovery entry (dead ones are dropped on the way)."""
        recovery = self.recovery
        phase, generation = self.phase, self.generation
        while recovery:
            entry = recovery[0]
            if phase.get(entry[0]) == READY and generation.get(entry[0], 0) == entry[1]:
                return entry
            recovery.popleft()
        return None

    def needs_idle(self) -> bool:
        """Whether the next batch is a crash retry, which waits for an actor with nothing
        else on it."""
        head = self._recovery_head()
        return head is not None and head[3]

    def take(self, limit: int, idle: bool = True) -> tuple[list[GrainKey], bool]:
        """Pop up to ``limit`` live Grains per the policy; and whether they must run alone.

        Retried Grains come first, in batches of at most their retry's limit, a crash retry
        only when the actor is ``idle`` (else nothing: the actor is left to drain)."""
        head = self._recovery_head()
        if head is not None:
            if head[3] and not idle:
                return [], False
            return self._take_recovery(min(limit, head[2]), head[3]), head[3]
        return self._take_fresh(limit), False

    def _take_recovery(self, limit: int, alone: bool) -> list[GrainKey]:
        recovery = self.recovery
        phase, generation = self.phase, self.generation
        taken: list[GrainKey] = []
        parent = recovery[0][0][1][:-1]
        while recovery and len(taken) < limit:
            grain, gen, own_limit, own_alone = recovery[0]
            if not (phase.get(grain) == READY and generation.get(grain, 0) == gen):
                recovery.popleft()
                continue
            if taken and (own_alone != alone or own_limit <= len(taken)
                          or (self.parent_bound and grain[1][:-1] != parent)):
                break
            recovery.popleft()
            taken.append(grain)
            limit = min(limit, own_limit)
        return taken

    def _take_fresh(self, limit: int) -> list[GrainKey]:
        phase = self.phase
        generation = self.generation
        fifo = self.fifo
        taken: list[GrainKey] = []
        if not self.parent_bound:
            popleft = fifo.popleft
            while fifo and len(taken) < limit:
                grain = popleft()
                if phase.get(grain) == READY and grain not in generation:
                    taken.append(grain)
            return taken
        while fifo:
            head = fifo[0]
            if phase.get(head) == READY and head not in generation:
                break
            fifo.popleft()
        else:
            return taken
        parent = head[1][:-1]
        siblings = self.by_parent[parent]
        while siblings and len(taken) < limit:
            grain = siblings.popleft()
            if phase.get(grain) == READY and grain not in generation:
                taken.append(grain)
        if not siblings:
            del self.by_parent[parent]
        return taken

    def live(self) -> tuple[list[GrainKey], list[GrainKey]]:
        """The live entries ``(recovery, fifo)`` in serving order (snapshots and checks)."""
        phase = self.phase
        generation = self.generation
        recovery = [
            g for g, gen, _, _ in self.recovery
            if phase.get(g) == READY and generation.get(g, 0) == gen
        ]
        fifo = [g for g in self.fifo if phase.get(g) == READY and g not in generation]
        return recovery, fifo


__all__ = ["CallQueue", "RecoveryEntry"]
