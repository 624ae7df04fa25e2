"""A ``Pipeline.run`` caller for fault tests: prints each ``index`` it receives, one per line.

    python -m bench.caller_run --store URL --run-id R [--address A] [--items 20]
        [--unordered] [--slow-first] [--slow-s 4] [--each-s 0] [--lease-ttl 2] [--shards 1]
        [--micro-batch 16] [--depth N] [--values]

Item 0 is slow with ``--slow-first`` (``--depth 1``: no batch queued behind it). With
``--values`` each line is ``index<TAB>value`` (the value as JSON), so a harness can check
what the caller received against the reference interpreter. Exits 3 with the driver's
one-line message on stderr when the driver stops (e.g. "lease lost: ..."), 0 when the run
completes.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.faults import PacedPipeline
from rayorch.core.errors import RayorchError


def items(count: int, slow_first: bool) -> list[str]:
    return [("slow" if slow_first and i == 0 else "item") + str(i) for i in range(count)]


def parse_line(line: str) -> tuple[int, object]:
    """``(index, value)`` of one printed line (value None without ``--values``)."""
    index, _, value = line.rstrip("\n").partition("\t")
    return int(index), (json.loads(value) if value else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--address", default=None)
    parser.add_argument("--items", type=int, default=20)
    parser.add_argument("--unordered", action="store_true")
    parser.add_argument("--slow-first", action="store_true")
    parser.add_argument("--slow-s", type=float, default=4.0)
    parser.add_argument("--each-s", type=float, default=0.0)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--depth", type=int, default=None, help="batches queued per actor")
    parser.add_argument("--values", action="store_true",
                        help="print 'index<TAB>value as JSON' instead of the index alone")
    args = parser.parse_args(argv)
    pipeline = PacedPipeline(slow_s=args.slow_s, each_s=args.each_s)
    handle = pipeline.run(items(args.items, args.slow_first), store=args.store,
                          address=args.address, run_id=args.run_id,
                          ordered=not args.unordered, lease_ttl_s=args.lease_ttl,
                          shards=args.shards, micro_batch=args.micro_batch, depth=args.depth,
                          progress=False, quiet=True)
    try:
        with handle:
            for index, value in handle:
                print(f"{index}\t{json.dumps(value)}" if args.values else index, flush=True)
    except RayorchError as exc:
        print(f"stopped: {exc}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
