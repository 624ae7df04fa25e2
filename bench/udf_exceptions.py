"""What a UDF exception costs: a model that takes ``--load-s`` to load, a few bad records.

Before issue 14 an exception replaced the actor (the model loaded again for every bad
record); now it is handled inside the living actor. Prints one JSON line::

    python -m bench.udf_exceptions --records 64 --bad 4 --load-s 1.0

(The same script runs against an older rayorch: it uses only the flat RayModule options.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import rayorch as ro


class SlowModel:
    """Loads for ``load_s`` seconds; raises on the records in ``bad``."""

    def __init__(self, load_s: float, bad: list[int]) -> None:
        time.sleep(load_s)
        self.bad = set(bad)
        self.pid = os.getpid()

    def __call__(self, xs: list[int]) -> list[Any]:
        for x in xs:
            if x in self.bad:
                raise ValueError(f"record {x} is corrupt")
        time.sleep(0.002 * len(xs))
        return [(x, self.pid) for x in xs]


class OneModel(ro.Pipeline):
    def __init__(self, load_s: float, bad: list[int], batch_size: int) -> None:
        super().__init__()
        self.model = ro.RayModule(SlowModel, load_s, bad, batch_size=batch_size,
                                  num_cpus=0.25, max_attempts=2)

    def forward(self, xs: Any) -> Any:
        return self.model(xs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--bad", type=int, default=4, help="bad records, spread evenly")
    parser.add_argument("--load-s", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    step = max(1, args.records // max(1, args.bad))
    bad = list(range(step // 2, args.records, step))[: args.bad]
    started = time.perf_counter()
    handle = OneModel(args.load_s, bad, args.batch_size).run(
        list(range(args.records)), progress=False, quiet=True)
    values = handle.collect()
    elapsed = time.perf_counter() - started
    failed = sum(1 for v in values if isinstance(v, ro.FailedResult))
    pids = {v[1] for v in values if not isinstance(v, ro.FailedResult)}
    print(json.dumps({"records": args.records, "bad": len(bad), "load_s": args.load_s,
                      "failed": failed, "actor_processes": len(pids),
                      "e2e_s": round(elapsed, 2)}))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
