"""A ``Pipeline.run`` caller for fault tests: prints each ``index`` it receives, one per line.

    python -m bench.caller_run --store URL --run-id R [--address A] [--items 20]
        [--unordered] [--slow-first] [--slow-s 4] [--each-s 0] [--lease-ttl 2]

Item 0 is slow with ``--slow-first``. Exits 3 with the driver's one-line message on
stderr when the driver stops (e.g. "lease lost: ..."), 0 when the run completes.
"""

from __future__ import annotations

import argparse
import sys

from bench.faults import PacedPipeline
from rayorch.core.errors import RayorchError


def items(count: int, slow_first: bool) -> list[str]:
    return [("slow" if slow_first and i == 0 else "item") + str(i) for i in range(count)]


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
    args = parser.parse_args(argv)
    pipeline = PacedPipeline(slow_s=args.slow_s, each_s=args.each_s)
    handle = pipeline.run(items(args.items, args.slow_first), store=args.store,
                          address=args.address, run_id=args.run_id,
                          ordered=not args.unordered, lease_ttl_s=args.lease_ttl,
                          progress=False, quiet=True)
    try:
        with handle:
            for index, _value in handle:
                print(index, flush=True)
    except RayorchError as exc:
        print(f"stopped: {exc}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
