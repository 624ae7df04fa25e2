"""A render actor reads a batch's object-store inputs ahead, on threads: in order, at most
``ahead`` at once, a failure stays its source's, local files are read in the caller."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from rayorch import RecordFailure
from rayorch.pipelines.input_files import InputFile, Prefetcher
from rayorch.pipelines.sources import each_alone, refuse


class Reads:
    """A ``check`` that records how many reads run at once and which thread ran each."""

    def __init__(self, meet: int = 1) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.threads: dict[str, str] = {}
        self.meet = threading.Barrier(meet) if meet > 1 else None

    def __call__(self, source: str) -> InputFile:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads[source] = threading.current_thread().name
        try:
            if self.meet is not None and source.startswith("s3://"):
                self.meet.wait(timeout=20)  # only reads that run at once get past this
            if source.endswith("missing.pdf"):
                raise refuse("missing", f"{source} does not exist")
            return InputFile(source, b"%PDF-", 5, data=b"%PDF-")
        finally:
            with self.lock:
                self.now -= 1


def run(sources: list[str], reads: Reads, ahead: int = 4) -> list[Any]:
    with Prefetcher(ahead) as fetch:
        return each_alone(fetch(sources, reads), lambda item: item[1]().name,
                          lambda item: str(item[0]))


def test_object_reads_run_at_once_in_order_with_failures_kept_apart() -> None:
    sources = [f"s3://bucket/doc{i}.pdf" for i in range(8)]
    sources[3] = "s3://bucket/missing.pdf"
    reads = Reads(meet=4)  # four reads must be in flight together, or this times out
    results = run(sources, reads)
    assert [r for i, r in enumerate(results) if i != 3] == \
        [s for i, s in enumerate(sources) if i != 3]
    assert isinstance(results[3], RecordFailure) and "missing" in str(results[3])
    assert reads.most == 4
    assert all(t.startswith("rayorch-fetch") for t in reads.threads.values())


def test_local_files_are_read_in_the_callers_thread_one_at_a_time() -> None:
    reads = Reads()
    assert run(["/data/a.pdf", "/data/b.pdf", "s3://bucket/c.pdf"], reads) == \
        ["/data/a.pdf", "/data/b.pdf", "s3://bucket/c.pdf"]
    assert set(reads.threads.values()) == {threading.current_thread().name}


@pytest.mark.parametrize("ahead", [2, 3])
def test_no_more_than_ahead_reads_at_once(ahead: int) -> None:
    reads = Reads()
    run([f"s3://bucket/doc{i}.pdf" for i in range(12)], reads, ahead)
    assert 1 <= reads.most <= ahead
