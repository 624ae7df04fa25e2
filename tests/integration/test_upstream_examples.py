"""Upstream RayOrch's documented programs, run *unchanged* against rayorch.

Each program below is written the way upstream's README shows it (the pipeline and UDF
code is not adapted to rayorch); where the README leaves something to the reader
(``load_model``, the MinerU UDFs) the test supplies a small stand-in. Each test checks
what the README says the program prints or returns. See docs/MIGRATING.md.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest

import rayorch as ro
from rayorch.inspect.audit import audit_run
from rayorch.store.registry import open_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module", autouse=True)
def ray_with_four_gpus() -> Iterator[None]:
    """The README's model stack asks for 4 one-GPU replicas: a local Ray that has them
    (logical GPUs; nothing here touches a device)."""
    if ray.is_initialized() and ray.cluster_resources().get("GPU", 0) < 4:
        ray.shutdown()
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=8, num_gpus=4, include_dashboard=False,
                 log_to_driver=False)
    yield


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        url = f"memory://upstream-{os.getpid()}-{time.monotonic_ns()}"
        held = open_store(url)  # a memory store lives while it is open: hold it for the test
        yield url
        held.close()
    else:
        yield request.getfixturevalue("redis_url")


def assert_audit_ok(handle: Any) -> None:
    """A run on Redis passes every invariant of ``rayorch audit`` (the memory store's
    lineage lives in the driver process: nothing to audit afterwards)."""
    if handle.store_url.startswith("redis"):
        report = audit_run(open_store(handle.store_url), handle.run_id)
        assert report.ok, [str(v) for v in report.violations]


# -- README section 3: "A minimal Pipeline is ordinary Python" ---------------------------
class AddOne:
    # A UDF receives one runtime batch and returns one result per input item.
    def run(self, values):  # type: ignore[no-untyped-def]
        return [value + 1 for value in values]


class MyPipeline(ro.Pipeline):
    def __init__(self):  # type: ignore[no-untyped-def]
        # Each RayModule owns a persistent actor pool; models loaded by the UDF stay warm
        # across batches.
        self.first = ro.RayModule(AddOne).ray_options(replicas=2, batch_size=8)
        self.second = ro.RayModule(AddOne).ray_options(replicas=2, batch_size=8)

    def forward(self, values):  # type: ignore[no-untyped-def]
        # forward() declares data dependencies; it does not execute the UDFs.
        return self.second(self.first(values))


@pytest.mark.long
def test_readme_minimal_pipeline_prints_3_4_5(capsys: pytest.CaptureFixture[str]) -> None:
    pipeline = MyPipeline()
    result = pipeline.run(
        [1, 2, 3],
        input_batch_size=2,           # Admit two source items as one input batch.
        max_active_input_batches=2,  # Allow two input batches to overlap.
    )

    print(result.outputs)  # [3, 4, 5]
    assert capsys.readouterr().out == "[3, 4, 5]\n"
    # rayorch's own iterator still works on a fresh run
    assert list(pipeline.run([1, 2, 3])) == [(0, 3), (1, 4), (2, 5)]
    # the functional form upstream documents as equivalent
    assert ro.run(MyPipeline(), [1, 2, 3]).outputs == [3, 4, 5]


# -- README section 3: one model stack, two Calls, one pool ------------------------------
class _FakeModel:
    """What ``load_model`` returns in this test: tags values with its process id."""

    def __init__(self, path: str) -> None:
        self.path = path

    def layout(self, values: list[str]) -> list[str]:
        return [f"layout({v})@{os.getpid()}" for v in values]

    def recognize(self, values: list[str]) -> list[str]:
        return [f"text({v.split('@')[0]})@{v.split('@')[1]}@{os.getpid()}" for v in values]


def load_model(model_path: str) -> _FakeModel:
    return _FakeModel(model_path)


class ModelStack:
    def __init__(self, model_path):  # type: ignore[no-untyped-def]
        self.model = load_model(model_path)

    def run(self, values, *, stage):  # type: ignore[no-untyped-def]
        if stage == "layout":
            return self.model.layout(values)
        if stage == "recognize":
            return self.model.recognize(values)
        raise ValueError(stage)


class DocumentPipeline(ro.Pipeline):
    def __init__(self, model_path):  # type: ignore[no-untyped-def]
        # This one RayModule describes one initialized model stack.
        self.model = (
            ro.RayModule(ModelStack)
            .pre_init(model_path)
            .ray_options(replicas=4, num_gpus=1, batch_size=16)
        )

    def forward(self, pages):  # type: ignore[no-untyped-def]
        # Each invocation is an independent DAG Call, while both Calls reuse
        # the actors and model state owned by the same RayModule object.
        layouts = self.model(pages, stage="layout")
        return self.model(layouts, stage="recognize")


def test_readme_model_stack_two_calls_share_one_pool() -> None:
    pipeline = DocumentPipeline("/models/stack")
    plan = pipeline.compile()
    assert [c.call.id for c in plan.calls if c.call] == ["model", "model@1"]
    assert len(plan.modules) == 1  # one pool for both Calls
    pages = [f"p{i}" for i in range(6)]
    outputs = pipeline.run(pages, input_batch_size=3).outputs
    assert [o.split("@")[0] for o in outputs] == [f"text(layout(p{i}))" for i in range(6)]
    pids = {pid for o in outputs for pid in o.split("@")[1:]}
    assert 1 <= len(pids) <= 4  # both stages ran on the same (at most 4) actors


# -- README section 3: the Executor ------------------------------------------------------
def test_readme_executor_reuses_actors() -> None:
    from rayorch import Executor

    # Reuse one Executor when repeated calls should share already-started actors.
    with Executor(MyPipeline()) as executor:
        first = executor.run([1, 2, 3])
        second = executor.run([4, 5, 6])
    assert first.outputs == [3, 4, 5]
    assert second.outputs == [6, 7, 8]


# -- README section 4.1: the MinerU topology (the UDFs are stand-ins) -----------------------
class MinerUPdfToPages:
    def __init__(self, dpi: int) -> None:
        self.dpi = dpi

    def run(self, pdfs: list[str]) -> list[list[dict[str, Any]]]:
        # "a.pdf:3" has 3 pages; a page number in "!k" fails its OCR
        out = []
        for pdf in pdfs:
            name, _, count = pdf.partition(":")
            out.append([{"pdf_path": name, "page_id": i, "scale": self.dpi / 72}
                        for i in range(int(count))])
        return out


class MinerUVlmOcrPage:
    def __init__(self, model: str, gpu_memory_utilization: float) -> None:
        self.model = model

    def run(self, pages: list[dict[str, Any]]) -> list[Any]:
        return [ro.RecordFailure(f"unreadable page {p['page_id']}")
                if p["pdf_path"].startswith("bad") and p["page_id"] == 1
                else f"{self.model}:{p['pdf_path']}#{p['page_id']}" for p in pages]


class PdfMetadata:
    def run(self, pdfs: list[str]) -> list[str]:
        return [pdf.partition(":")[0].removesuffix(".pdf") for pdf in pdfs]


class MinerUAssembleDoc:
    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir

    def run(self, contents: list[list[str]], pages: list[list[dict[str, Any]]],
            stems: list[str]) -> list[dict[str, Any]]:
        return [{"pdf": stem, "md_path": f"{self.output_dir}/{stem}/vlm/{stem}.md",
                 "chars": sum(len(c) for c in content), "pages": [p["page_id"] for p in page]}
                for content, page, stem in zip(contents, pages, stems)]


class MinerUPipeline(ro.Pipeline):
    def __init__(self, *, model, output_dir, num_gpus=1, batch_size=64):  # type: ignore[no-untyped-def]
        # CPU actors render each PDF into an ordered list of PageRecords.
        self.render = (
            ro.RayModule(MinerUPdfToPages)
            .pre_init(dpi=200)
            .ray_options(replicas=num_gpus, batch_size=1, num_cpus=1)
        )
        # Each OCR replica keeps one MinerU/vLLM model resident on one GPU.
        self.ocr = (
            ro.RayModule(MinerUVlmOcrPage)
            .pre_init(model=model, gpu_memory_utilization=0.8)
            .ray_options(
                replicas=num_gpus,
                batch_size=batch_size,
                num_gpus=1,
                num_cpus=1,
            )
        )
        # This lightweight branch remains in the parent PDF Domain.
        self.metadata = ro.RayModule(PdfMetadata).ray_options(
            replicas=1,
            batch_size=32,
            num_cpus=1,
        )
        # Assembly receives ordered page groups and writes document artifacts.
        self.assemble = (
            ro.RayModule(MinerUAssembleDoc)
            .pre_init(output_dir=output_dir)
            .ray_options(replicas=num_gpus, batch_size=4, num_cpus=1)
        )

    def forward(self, pdfs):  # type: ignore[no-untyped-def]
        # PDF:[page0, page1, ...] -> independently schedulable PDF/page items.
        pages = ro.F.expand(cast(ro.Port, self.render(pdfs)))
        # READY pages from different PDFs may share the same OCR batch.
        contents = cast(ro.Port, self.ocr(pages))
        stems = cast(ro.Port, self.metadata(pdfs))
        # Return both Ports to the PDF Domain with identical membership/order.
        # Failed or filtered `contents` also define which pages survive.
        content_groups, ordered_page_groups = ro.F.reduce_aligned(
            contents,
            pages,
            members=contents,
        )
        return self.assemble(content_groups, ordered_page_groups, stems)


def test_readme_mineru_topology_reduces_aligned_groups_in_page_order(store_url: str) -> None:
    pipeline = MinerUPipeline(model="m25", output_dir="/out", num_gpus=2, batch_size=4)
    handle = pipeline.run(["a.pdf:3", "bad.pdf:2", "c.pdf:0", "d.pdf:1"], store=store_url)
    outputs = handle.outputs
    assert_audit_ok(handle)
    assert outputs[0] == {"pdf": "a", "md_path": "/out/a/vlm/a.md", "pages": [0, 1, 2],
                          "chars": sum(len(f"m25:a.pdf#{i}") for i in range(3))}
    # bad.pdf's page 1 failed: its document is not assembled, the others are
    assert isinstance(outputs[1], ro.OutputIssue)
    assert outputs[1].outcome is ro.ItemOutcome.SUPPRESSED
    assert "unreadable page 1" in str(outputs[1].cause)
    assert outputs[2]["pages"] == [] and outputs[3]["pages"] == [0]


# -- where rayorch and upstream differ in meaning (docs/MIGRATING.md, "Concepts") -----------
class Identity:
    def run(self, values):  # type: ignore[no-untyped-def]
        return list(values)


class NoneEmptyOrFail:
    def run(self, values):  # type: ignore[no-untyped-def]
        return [None if v == 1 else [] if v == 2 else ro.RecordFailure("three") if v == 3
                else v for v in values]


class IsEven:
    def run(self, values):  # type: ignore[no-untyped-def]
        return [v % 2 == 0 for v in values]


class Branches(ro.Pipeline):
    def __init__(self):  # type: ignore[no-untyped-def]
        self.a = ro.RayModule(Identity).ray_options(num_cpus=0.25, batch_size=4)
        self.b = ro.RayModule(NoneEmptyOrFail).ray_options(num_cpus=0.25, batch_size=4)
        self.even = ro.RayModule(IsEven).ray_options(num_cpus=0.25, batch_size=4)

    def forward(self, values):  # type: ignore[no-untyped-def]
        b = self.b(values)
        return self.a(values), b, ro.F.filter(b, self.even(values))


def test_several_outputs_keep_their_own_outcomes(store_url: str) -> None:
    handle = Branches().run([0, 1, 2, 3], store=store_url, quiet=True)
    a, b, kept = handle.outputs
    assert_audit_ok(handle)
    assert a == [0, 1, 2, 3]  # one failed output does not collapse the others
    assert b[:3] == [0, None, []]  # None and [] are ordinary Present values
    assert isinstance(b[3], ro.OutputIssue) and b[3].outcome is ro.ItemOutcome.FAILED
    assert b[3].cause == "three"
    assert kept[0] == 0 and kept[2] == []
    assert kept[1].outcome is ro.ItemOutcome.DROPPED and kept[1].cause is None
    # upstream keeps a filtered Failed item FAILED; rayorch says SUPPRESSED and names the
    # failure it came from (only the Grain that failed is FAILED)
    assert kept[3].outcome is ro.ItemOutcome.SUPPRESSED
    assert kept[3].cause is not None and "failed: three" in kept[3].cause
    # rayorch's own iterator: the row is a FailedResult that still carries every output
    rows = list(Branches().run([3], store=store_url, quiet=True))
    (index, row), = rows
    assert index == 0 and isinstance(row, ro.FailedResult) and row.port == "output1"
    assert row.outputs is not None and row.outputs[0] == 3
    assert row.outputs[1].outcome is ro.ItemOutcome.FAILED


class NotAList:
    def run(self, values):  # type: ignore[no-untyped-def]
        return [list(range(v)) if v else "oops" for v in values]


class Count:
    def run(self, groups):  # type: ignore[no-untyped-def]
        return [len(g) for g in groups]


class ExpandNonList(ro.Pipeline):
    def __init__(self):  # type: ignore[no-untyped-def]
        self.split = ro.RayModule(NotAList).ray_options(num_cpus=0.25, batch_size=4)
        self.count = ro.RayModule(Count).ray_options(num_cpus=0.25)

    def forward(self, values):  # type: ignore[no-untyped-def]
        return self.count(ro.F.reduce(ro.F.expand(self.split(values))))


def test_expanding_a_non_list_fails_that_record_only() -> None:
    # upstream aborts the run (a Worker contract error); rayorch fails that parent only
    outputs = ExpandNonList().run([2, 0, 3], quiet=True).outputs
    assert outputs[0] == 2 and outputs[2] == 3
    assert outputs[1].outcome is ro.ItemOutcome.SUPPRESSED
    assert "not a sequence" in str(outputs[1].cause)
