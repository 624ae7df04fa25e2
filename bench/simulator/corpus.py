"""The paper's MinerU corpus shape: 3,689 parents, 174,744 children, 1..427 per parent.

Recipe (seeded, deterministic, exact):

1. Draw one log-normal value ``x_i ~ LogNormal(0, sigma)`` per parent (``random.Random(seed)``;
   the draw order is the source order).
2. Normalise to ``u_i = (x_i - min x) / (max x - min x)`` in ``[0, 1]``: the smallest draw
   has ``u = 0`` and the largest ``u = 1``.
3. Map ``r_i = low + (high - low) * u_i ** p`` with the exponent ``p`` found by bisection so
   that ``sum(r_i)`` equals the wanted total (the sum falls monotonically as ``p`` grows).
4. Round by largest remainder: ``floor(r_i)``, then ``+1`` to the parents with the largest
   fractional parts until the total is exact (ties: lower index first). The smallest parent
   stays at exactly ``low`` and the largest at exactly ``high`` (both have no fraction).

So the corpus has exactly the paper's parent count, total, minimum and maximum, and a
long right tail (most parents are short, a few hold hundreds of children).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from bench.workload import BenchError

PAPER_PARENTS = 3_689
PAPER_CHILDREN = 174_744
PAPER_MIN = 1
PAPER_MAX = 427


def long_tail_counts(
    parents: int = PAPER_PARENTS,
    total: int = PAPER_CHILDREN,
    low: int = PAPER_MIN,
    high: int = PAPER_MAX,
    sigma: float = 1.0,
    seed: int = 0,
) -> list[int]:
    """``parents`` child counts in ``[low, high]`` summing to ``total`` (see module doc)."""
    if parents < 2 or not parents * low < total < parents * high or not 1 <= low < high:
        raise BenchError(
            f"cannot draw {parents} counts in [{low}, {high}] summing to {total}: need "
            f"parents >= 2, 1 <= low < high and parents*low < total < parents*high"
        )
    rng = random.Random(seed)
    draws = [rng.lognormvariate(0.0, sigma) for _ in range(parents)]
    smallest, largest = min(draws), max(draws)
    units = [(x - smallest) / (largest - smallest) for x in draws]
    span = high - low

    def real_sum(p: float) -> float:
        return float(sum(low + span * u**p for u in units))

    lo_p, hi_p = 1e-6, 1.0
    while real_sum(hi_p) > total:  # make sure the bracket holds the answer
        hi_p *= 2.0
        if hi_p > 1e6:
            raise BenchError("the long-tail exponent search did not converge; change sigma")
    for _ in range(200):
        mid = (lo_p + hi_p) / 2.0
        if real_sum(mid) > total:
            lo_p = mid
        else:
            hi_p = mid
    exponent = (lo_p + hi_p) / 2.0
    reals = [low + span * u**exponent for u in units]
    counts = [math.floor(r) for r in reals]
    missing = total - sum(counts)
    if missing < 0:  # cannot happen: floors never exceed the reals' sum
        raise BenchError("largest-remainder rounding overshot the total")
    by_fraction = sorted(range(parents), key=lambda i: (-(reals[i] - counts[i]), i))
    for i in by_fraction[:missing]:
        counts[i] += 1
    return [max(low, min(high, c)) for c in counts]


def corpus_stats(counts: Sequence[int]) -> dict[str, float]:
    """Totals and tail shape of a corpus: parents, children, min/median/p90/p99/max, top-5%."""
    ordered = sorted(counts)
    n = len(ordered)

    def quantile(q: float) -> float:
        return float(ordered[min(n - 1, int(q * n))])

    top = max(1, math.ceil(0.05 * n))
    total = sum(ordered)
    return {
        "parents": n,
        "children": total,
        "min": ordered[0],
        "median": quantile(0.5),
        "p90": quantile(0.9),
        "p99": quantile(0.99),
        "max": ordered[-1],
        "top5pct_share": sum(ordered[-top:]) / total,
    }


__all__ = [
    "PAPER_CHILDREN",
    "PAPER_MAX",
    "PAPER_MIN",
    "PAPER_PARENTS",
    "corpus_stats",
    "long_tail_counts",
]
