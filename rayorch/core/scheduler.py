"""Per-Call ready queues and the two reservation policies (docs/ARCHITECTURE.md, "Semantics" 6).

Each Call has a FIFO of Grains in the order they became ready and a recovery queue
(Grains sent back by a physical failure) that is served first. Entries are removed
lazily, so a dispatch, a suppression or a seal never has to search a queue: a FIFO
entry is live while its Grain is ``READY`` at generation 0 (a retried Grain is never
served from the FIFO again); a recovery entry ``(grain, generation)`` is live while
the Grain is ``READY`` at that generation.

* ``elastic``: up to ``B`` live Grains from the FIFO head, whatever their parent; O(B).
* ``parent_bound``: up to ``B`` live siblings of the head Grain's parent, in ready order
  (a per-parent FIFO makes this O(B) as well).
* A retried Grain is dispatched **alone** (a batch of one): a record that poisons
  every batch it is in can then only exhaust its own attempts, never its batch-mates'.
"""


from __future__ import annotations

from collections import deque

from rayorch.core.ids import CallId, GrainKey, Path
from rayorch.core.plan import Policy
from rayorch.core.vocabulary import READY

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
        self.recovery: deque[tuple[GrainKey, int]] = deque()
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

    def push_recovery(self, grain: GrainKey, generation: int) -> None:
        """``grain`` is ready again, as attempt ``generation``, after a physical failure."""
        self.recovery.append((grain, generation))

    def take(self, limit: int) -> list[GrainKey]:
        """Pop up to ``limit`` live Grains per the policy (a retried Grain goes alone)."""
        phase = self.phase
        generation = self.generation
        recovery = self.recovery
        while recovery:
            grain, gen = recovery.popleft()
            if phase.get(grain) == READY and generation.get(grain, 0) == gen:
                return [grain]
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
            g for g, gen in self.recovery
            if phase.get(g) == READY and generation.get(g, 0) == gen
        ]
        fifo = [g for g in self.fifo if phase.get(g) == READY and g not in generation]
        return recovery, fifo


__all__ = ["CallQueue"]
