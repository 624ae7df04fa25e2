"""Grains per second through the pure lineage kernel (no Ray, no store, no sleeps).

Workload: render (1 Grain per document) -> F.expand -> ocr (1 Grain per page) ->
F.reduce -> assemble (1 Grain per document), with a long-tailed page count per
document (1..427, Pareto-like, like the paper's corpus). Every Grain goes through
take_batch + GrainDispatched + GrainCommitted + propagation; values are trivial.

    python bench/kernel.py [--pages 100000] [--batch 64] [--policy elastic] [--active 512]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import rayorch as ro
from rayorch import F
from rayorch.core.facts import GrainCommitted, GrainDispatched, OutputEmitted, SourceAdmitted
from rayorch.core.plan import Plan
from rayorch.core.state import Kernel


def _unused(*columns: list[object]) -> list[object]:
    raise AssertionError("the kernel benchmark never runs user code")


class Parse(ro.Pipeline):
    def __init__(self, batch: int, policy: str) -> None:
        super().__init__()
        self.render = ro.RayModule(_unused, batch_size=4)
        self.ocr = ro.RayModule(_unused, batch_size=batch, policy=policy)
        self.assemble = ro.RayModule(_unused, batch_size=16)

    def forward(self, docs: ro.Port) -> Any:
        return self.assemble(F.reduce(self.ocr(F.expand(self.render(docs)))))


def long_tail_pages(total_pages: int, seed: int = 0) -> list[int]:
    """Page counts 1..427 with a heavy tail, summing to at least ``total_pages``."""
    rng = random.Random(seed)
    counts: list[int] = []
    while sum(counts) < total_pages:
        counts.append(min(427, max(1, int(rng.paretovariate(1.2) * 8))))
    return counts


def prebuilt_reports(pages: list[int]) -> dict[tuple[str, tuple[int, ...]], GrainCommitted]:
    """Every Grain's report, built up front as the actors would build them (not timed)."""
    reports: dict[tuple[str, tuple[int, ...]], GrainCommitted] = {}
    for doc, count in enumerate(pages):
        root = (doc,)
        reports[("render", root)] = GrainCommitted("render", root, 0, "present", (range(count),))
        reports[("assemble", root)] = GrainCommitted("assemble", root, 0, "present", (count,))
        for page in range(count):
            path = (doc, page)
            reports[("ocr", path)] = GrainCommitted("ocr", path, 0, "present", (page,))
    return reports


def run(
    plan: Plan,
    pages: list[int],
    batch: dict[str, int],
    active: int,
    reports: dict[tuple[str, tuple[int, ...]], GrainCommitted] | None = None,
) -> tuple[int, float, float]:
    """Drive the kernel like a driver with instant actors; (grains, wall s, CPU s).

    With ``reports`` the actors' reports are prebuilt (the driver only folds them);
    without, the driver also constructs every GrainCommitted.
    """
    kernel = Kernel(plan, max_active_sources=active, total_sources=len(pages))
    apply = kernel.apply
    calls = [node.call.id for node in plan.calls if node.call is not None]
    next_source = 0
    grains = 0
    started = time.perf_counter()
    cpu_started = time.process_time()
    while not kernel.run_completed:
        room = kernel.admissible()
        for _ in range(room):
            apply(SourceAdmitted(next_source, (pages[next_source],)))
            next_source += 1
        if next_source == len(pages):
            kernel.close_input()
        for call in calls:
            while True:
                taken = kernel.take_batch(call, batch[call])
                if not taken:
                    break
                for (c, path), gen in taken:
                    apply(GrainDispatched(c, path, gen))
                if reports is not None:
                    for grain, _gen in taken:
                        apply(reports[grain])
                    grains += len(taken)
                    continue
                for (c, path), gen in taken:
                    if c == "render":
                        value: object = range(kernel.inputs_of((c, path))[0])
                    elif c == "ocr":
                        value = path[-1]
                    else:
                        value = len(kernel.inputs_of((c, path))[0])
                    apply(GrainCommitted(c, path, gen, "present", (value,)))
                grains += len(taken)
        for index, _items in kernel.pop_completed():
            apply(OutputEmitted(index))
    return grains, time.perf_counter() - started, time.process_time() - cpu_started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--policy", default="elastic", choices=["elastic", "parent_bound"])
    parser.add_argument("--active", type=int, default=512, help="max_active_sources")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    pages = long_tail_pages(args.pages)
    plan = Parse(args.batch, args.policy).compile()
    batch = {"render": 4, "ocr": args.batch, "assemble": 16}
    reports = prebuilt_reports(pages)
    print(f"{len(pages)} documents, {sum(pages)} pages (1..{max(pages)} per document), "
          f"policy {args.policy}, batch {args.batch}, max_active_sources {args.active}")
    for label, prebuilt in (("kernel (reports built by actors)", reports),
                            ("kernel + building every report", None)):
        best = 0.0
        for _ in range(args.repeat):
            grains, wall, cpu = run(plan, pages, batch, args.active, prebuilt)
            best = max(best, grains / cpu)
            print(f"  {label}: {grains} grains, wall {wall:.2f} s = {grains / wall:,.0f}/s, "
                  f"CPU {cpu:.2f} s = {grains / cpu:,.0f}/s")
        print(f"best {label}: {best:,.0f} grains/s per core (CPU time)")


if __name__ == "__main__":
    main()
