"""A set of source indexes kept as sorted, merged ranges.

The kernel remembers which sources it delivered and forgot (docs/ARCHITECTURE.md,
"Bounded driver memory"). Sources finish roughly in index order, so the set is a
handful of ranges, not one entry per source: a shard's sources are runs of
``micro_batch`` consecutive indexes, so a kernel that forgets every source of its
shard keeps one range per run at worst (one in all when it holds every shard).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator


class IndexSet:
    """Non-negative ints as disjoint, non-adjacent ``[start, end)`` ranges."""

    __slots__ = ("_count", "_ends", "_starts")

    def __init__(self, indexes: Iterable[int] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._count = 0
        for index in indexes:
            self.add(index)

    def __contains__(self, index: object) -> bool:
        if not isinstance(index, int):
            return False
        at = bisect_right(self._starts, index) - 1
        return at >= 0 and index < self._ends[at]

    def add(self, index: int) -> None:
        starts, ends = self._starts, self._ends
        if starts and index == ends[-1]:  # the common case: the next index in order
            ends[-1] = index + 1
            self._count += 1
            return
        at = bisect_right(starts, index) - 1
        if at >= 0 and index < ends[at]:
            return  # already in
        self._count += 1
        joins_left = at >= 0 and ends[at] == index
        joins_right = at + 1 < len(starts) and starts[at + 1] == index + 1
        if joins_left and joins_right:
            ends[at] = ends[at + 1]
            del starts[at + 1], ends[at + 1]
        elif joins_left:
            ends[at] = index + 1
        elif joins_right:
            starts[at + 1] = index
        else:
            starts.insert(at + 1, index)
            ends.insert(at + 1, index + 1)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        for start, end in zip(self._starts, self._ends):
            yield from range(start, end)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IndexSet):
            return self._starts == other._starts and self._ends == other._ends
        if isinstance(other, set | frozenset):
            return len(other) == self._count and all(i in self for i in other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def ranges(self) -> int:
        """How many ranges hold the set (its memory is proportional to this)."""
        return len(self._starts)

    def __repr__(self) -> str:
        shown = ", ".join(f"{s}..{e - 1}" if e - s > 1 else f"{s}"
                          for s, e in zip(self._starts[:4], self._ends[:4]))
        more = ", ..." if len(self._starts) > 4 else ""
        return f"IndexSet({shown}{more})"


__all__ = ["IndexSet"]
