"""rayorch in one minute: documents -> pages -> per-page work batched across documents -> documents.

Run it::

    python examples/quickstart.py                          # in-memory lineage store
    python examples/quickstart.py redis://127.0.0.1:6379/0 # lineage in Redis

With Redis the lineage outlives the script: audit it with the command it prints
(``rayorch audit RUN --store redis://...``). The in-memory lineage ends with the script.

Every document comes back once, with its pages in order, even though the ``Shout``
stage batches pages of different documents together and one page fails.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray

import rayorch as ro
from rayorch import F


class SplitPages:
    """A document (a string) -> its pages (one per sentence)."""

    def __call__(self, docs: list[str]) -> list[list[str]]:
        return [[s.strip() for s in doc.split(".") if s.strip()] for doc in docs]


class Shout:
    """Per-page work, batched across documents (think: OCR on a GPU)."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __call__(self, pages: list[str]) -> list[object]:
        return [
            ro.RecordFailure("this page is unreadable")
            if "unreadable" in p
            else p.upper() + self.suffix
            for p in pages
        ]


class Join:
    """A document's pages (in page order) -> one text."""

    def __call__(self, page_lists: list[list[str]]) -> list[str]:
        return [" ".join(pages) for pages in page_lists]


class Quickstart(ro.Pipeline):
    def __init__(self) -> None:
        super().__init__()
        self.split = ro.RayModule(SplitPages, num_cpus=0.25)
        self.shout = ro.RayModule(Shout, suffix="!", batch_size=8, replicas=2, num_cpus=0.25)
        self.join = ro.RayModule(Join, num_cpus=0.25)

    def forward(self, docs):  # type: ignore[no-untyped-def]
        pages = F.expand(self.split(docs))
        return self.join(F.reduce(self.shout(pages)))


def main() -> None:
    store = sys.argv[1] if len(sys.argv) > 1 else "memory://"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    docs = [
        "Ray runs tasks. Actors keep state",
        "One page only",
        "This one has an unreadable page. So it fails as a whole",
        "Pages come back. In order. Every time",
    ]
    run = Quickstart().run(docs, store=store, progress=False)
    for index, result in run:  # a FailedResult prints its outcome and cause in words
        print(f"doc {index}: {result}")
    if store.startswith("memory://"):
        print(f"run {run.run_id}: its lineage was in memory, gone when this script ends")
    else:
        print(f"run {run.run_id}: rayorch audit {run.run_id} --store {store}")
    ray.shutdown()


if __name__ == "__main__":
    main()
