"""IndexSet: the kernel's compact record of delivered sources."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rayorch.core.index_set import IndexSet


@given(st.lists(st.integers(0, 200)), st.lists(st.integers(-5, 210)))
def test_index_set_is_a_set_of_ints(added: list[int], probes: list[int]) -> None:
    got = IndexSet(added)
    want = set(added)
    assert len(got) == len(want) and list(got) == sorted(want) and got == want
    assert all((p in got) == (p in want) for p in probes)
    runs = sum(1 for i in want if i - 1 not in want)  # maximal runs of consecutive ints
    assert got.ranges == runs


def test_sources_finishing_in_order_take_one_range() -> None:
    done = IndexSet()
    for block in range(0, 10_000, 16):  # micro-batches of 16, each finishing backwards
        for i in reversed(range(block, block + 16)):
            done.add(i)
    assert len(done) == 10_000 and done.ranges == 1 and "x" not in done
