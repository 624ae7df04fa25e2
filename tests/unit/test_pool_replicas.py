"""``replicas=N``, ``replicas=(min, max)`` and ``replicas="auto"`` on a module: what each
means, how a wrong one is refused, and where it shows (explain, the stored description)."""

from __future__ import annotations

import re
from typing import Any

import pytest

import rayorch as ro
from rayorch.core.compile_errors import ModuleDefinitionError
from rayorch.core.plan import Plan
from rayorch.core.pool_sizing import AUTO_MAX_REPLICAS


def ident(xs: list[Any]) -> list[Any]:
    return xs


class Two(ro.Pipeline):
    def __init__(self, first: Any, second: Any) -> None:
        super().__init__()
        self.first = ro.RayModule(ident, replicas=first)
        self.second = ro.RayModule(ident, replicas=second, num_gpus=1)

    def forward(self, xs: Any) -> Any:
        return self.second(self.first(xs))


@pytest.mark.parametrize(("given", "start", "most", "text"), [
    (3, 3, None, "3"),
    ((1, 4), 1, 4, "(1, 4)"),
    ([2, 6], 2, 6, "(2, 6)"),
    ((2, 2), 2, None, "2"),  # a range of one size is a fixed size
    ("auto", 1, AUTO_MAX_REPLICAS, "auto"),
])
def test_replicas_forms(given: Any, start: int, most: int | None, text: str) -> None:
    options = ro.RayModule(ident, replicas=given).options
    assert (options.replicas, options.max_replicas, options.replicas_text) == (start, most, text)
    assert options.sizes_itself == (most is not None)


@pytest.mark.parametrize("given", [0, -1, True, 2.0, "many", (3, 1), (0, 2), (1, 2, 3), (1,)])
def test_a_wrong_replicas_is_refused_with_the_forms_it_may_take(given: Any) -> None:
    with pytest.raises(ModuleDefinitionError, match="invalid option replicas") as caught:
        ro.RayModule(ident, replicas=given)
    assert "(min, max)" in str(caught.value) and '"auto"' in str(caught.value)


def test_the_upstream_builder_takes_a_range_too() -> None:
    module = ro.RayModule(ident).ray_options(replicas=(2, 5))
    assert (module.options.replicas, module.options.max_replicas) == (2, 5)


def test_explain_shows_each_pool_and_the_description_keeps_the_range() -> None:
    plan = Two((1, 4), "auto").compile()
    text = plan.explain()
    assert "pools:" in text
    assert "first" in text and "replicas=(1, 4)" in text
    assert "replicas=auto" in text and "num_gpus=1" in text
    back = Plan.from_description(plan.describe())
    assert [m.options.replicas_text for m in back.modules] == ["(1, 4)", "auto"]


def test_a_fixed_size_keeps_the_plan_fingerprint_it_had() -> None:
    """Only a range adds to the stored description, so older runs still resume."""
    fixed = Two(2, 3).compile()
    assert all("max_replicas" not in m["options"] for m in fixed.describe()["modules"])
    assert Two(2, 3).compile().fingerprint() == fixed.fingerprint()
    assert Two((2, 4), 3).compile().fingerprint() != fixed.fingerprint()


@pytest.mark.parametrize(("text", "value"), [("4", 4), ("1-8", (1, 8)), ("auto", "auto")])
def test_the_job_commands_take_replicas_as_a_number_a_range_or_auto(text: str, value: Any
                                                                     ) -> None:
    from rayorch.pipelines.job.run_command import replicas_type
    from rayorch.pipelines.pdf import PdfPipeline

    assert replicas_type(text) == value
    plan = PdfPipeline("text", replicas=value, render_replicas=value).compile()
    ocr = next(m for m in plan.modules if m.name == "ocr")
    assert ocr.options.replicas_text == {"4": "4", "1-8": "(1, 8)", "auto": "auto"}[text]


@pytest.mark.parametrize("text", ["0", "3-1", "-2", "many", "1-"])
def test_a_wrong_replicas_option_names_the_forms(text: str) -> None:
    import argparse

    from rayorch.pipelines.job.run_command import replicas_type

    with pytest.raises(argparse.ArgumentTypeError, match="range min-max"):
        replicas_type(text)


# -- the jobs' default: every stage sizes itself; a number given is that number -----------
def pool_sizes(plan: Plan) -> dict[str, str]:
    return {m.name: m.options.replicas_text for m in plan.modules}


@pytest.mark.parametrize(("engine", "sizes"), [
    ("auto", {"render": "auto", "ocr": "auto", "assemble": "1"}),
    ("rapidocr", {"render": "auto", "ocr": "auto", "assemble": "1"}),
    ("layout", {"render": "auto", "layout": "auto", "recognise": "auto", "keep": "1",
                "assemble_page": "1", "assemble": "1"}),
])
def test_the_pdf_pipelines_stages_size_themselves_by_default(engine: str,
                                                             sizes: dict[str, str]) -> None:
    from rayorch.pipelines.pdf import PdfPipeline

    plan = PdfPipeline(engine).compile()
    assert pool_sizes(plan) == sizes
    text = plan.explain()
    for name, size in sizes.items():
        assert re.search(rf"^  {name} +replicas={re.escape(size)} ", text, re.M), text


@pytest.mark.parametrize(("gpus", "size"), [(1.0, "auto"), (0.0, "1")])
def test_a_model_engine_sizes_itself_with_gpus_and_keeps_one_engine_on_a_cpu_build(
        monkeypatch: pytest.MonkeyPatch, gpus: float, size: str) -> None:
    """One engine per GPU, as many as the free GPUs allow; on vLLM's CPU build one engine
    (a second can exhaust the memory), unless a size is given."""
    from rayorch.pipelines import pdf, video

    monkeypatch.setattr(pdf, "vllm_num_gpus", lambda: gpus)
    monkeypatch.setattr(video, "vllm_num_gpus", lambda: gpus)
    assert pool_sizes(pdf.PdfPipeline("vllm").compile())["ocr"] == size
    assert pool_sizes(pdf.PdfPipeline("mineru").compile())["mineru"] == size
    assert pool_sizes(video.VideoPipeline("vllm").compile())["annotate"] == size
    assert pool_sizes(pdf.PdfPipeline("vllm", replicas=3).compile())["ocr"] == "3"
    assert pool_sizes(pdf.PdfPipeline("mineru", replicas=(1, 2)).compile())["mineru"] == "(1, 2)"


def test_the_video_pipelines_stages_size_themselves_by_default() -> None:
    from rayorch.pipelines.video import VideoPipeline

    assert pool_sizes(VideoPipeline("stats").compile()) == {
        "probe": "auto", "decode": "auto", "annotate": "auto", "assemble": "1"}
    fixed = VideoPipeline("ocr", replicas=2, decode_replicas=1, probe_replicas=(1, 3))
    assert pool_sizes(fixed.compile()) == {
        "probe": "(1, 3)", "decode": "1", "annotate": "2", "assemble": "1"}


def job_pipeline(*argv: str) -> Plan:
    from rayorch.cli import build_parser
    from rayorch.pipelines.job import run_command, video_command

    args = build_parser().parse_args(["run", *argv, "--input", "in", "--output", "out"])
    build = run_command.pdf_pipeline if argv[0] == "pdf" else video_command.video_pipeline
    plan: Plan = build(args).compile()
    return plan


def test_the_job_options_default_to_auto_and_a_number_fixes_the_pool() -> None:
    from rayorch.pipelines.job.cli import pools_text

    assert pools_text(job_pipeline("pdf")) == "render auto, ocr auto, assemble x1"
    assert pools_text(job_pipeline("pdf", "--replicas", "2", "--render-replicas", "1-3")) == (
        "render x1-3, ocr x2, assemble x1")
    layout = job_pipeline("pdf", "--ocr", "layout", "--layout-replicas", "2")
    assert pool_sizes(layout)["layout"] == "2" and pool_sizes(layout)["recognise"] == "auto"
    assert pools_text(job_pipeline("video")) == (
        "probe auto, decode auto, annotate auto, assemble x1")
    assert pools_text(job_pipeline("video", "--replicas", "2", "--decode-replicas", "3")) == (
        "probe auto, decode x3, annotate x2, assemble x1")


def test_a_local_ray_fits_the_pools_at_their_start_and_declares_the_gpus_to_grow_into(
        ) -> None:
    from rayorch.pipelines.job.cli import ray_size_for

    def gpus() -> int:
        return 4

    auto = Two(1, "auto").compile()  # second: num_gpus=1, sizes itself
    assert ray_size_for(auto, cpus=2, gpus=gpus) == (2, 4)
    assert ray_size_for(Two((3, 6), 2).compile(), cpus=2, gpus=gpus) == (5, 4)  # mins; all GPUs
    assert ray_size_for(Two(1, 2).compile(), cpus=8, gpus=lambda: 0) == (8, 2)  # logical GPUs
    cpu_only = Two(1, 2)
    cpu_only.second = ro.RayModule(ident, replicas=2)
    assert ray_size_for(cpu_only.compile(), cpus=8, gpus=lambda: 1 / 0) == (8, None)  # not asked
    assert ray_size_for(Two(1, "auto").compile(), cpus=2, gpus=lambda: 0) == (2, 1)


def test_the_summary_names_each_pools_sizes_and_the_binding_stage() -> None:
    from rayorch.pipelines.job.cli import pools_summary
    from rayorch.pipelines.job.summary import pools_line

    class Sizer:
        def size_over_time(self, name: str) -> list[tuple[float, int]]:
            return {"first": [(0.0, 1), (5.0, 3), (40.0, 2)]}.get(name, [(0.0, 2)])

        def binding(self) -> str:
            return "first"

    plan = Two("auto", 2).compile()
    result = pools_summary(plan, Sizer())
    assert result["bound_by"] == "first"
    assert result["pools"]["first"] == {"replicas": "auto", "start": 1, "most": 3, "end": 2,
                                        "changes": 2}
    assert result["pools"]["second"]["replicas"] == "2"
    assert pools_line(result["pools"], result["bound_by"]) == (
        "pools: first auto (1, up to 3, 2 at the end), second x2; bound by first")
    fixed = pools_summary(Two(2, 3).compile(), None)
    assert fixed["bound_by"] is None and fixed["pools"]["second"]["start"] == 3
    assert pools_line(fixed["pools"], None) == "pools: first x2, second x3"


def test_status_gives_a_pool_that_sizes_itself_no_one_size() -> None:
    """``rayorch status``'s busy share divides by a pool's size: a pool that sized itself
    has none in the stored plan (its min would overstate the share)."""
    from rayorch.inspect.status import pool_sizes

    sizes = pool_sizes(Two("auto", 3).compile().describe())
    assert sorted(sizes.values(), key=str) == [(3, 1, None), (None, 1, "auto")]


def test_a_self_sizing_rapidocr_pool_runs_onnx_on_the_cpus_its_actors_declare() -> None:
    """RapidOCR's ONNX Runtime takes every core by default: a pool that grows actors by
    their declared CPUs would run (cores x actors) threads. Its actors use what they declare;
    a fixed pool keeps the default (its user chose the count)."""
    pytest.importorskip("rapidocr_onnxruntime")
    from rayorch.pipelines.document.ocr import RapidOcrEngine
    from rayorch.pipelines.pdf import PdfPipeline

    def ocr_kwargs(**options: Any) -> dict[str, Any]:
        return dict(PdfPipeline(**options).compile().module("ocr").kwargs)

    assert ocr_kwargs()["intra_op_num_threads"] == 1  # auto, 0.5 CPU an actor
    assert ocr_kwargs(engine="rapidocr", replicas=(1, 4))["intra_op_num_threads"] == 1
    assert ocr_kwargs(ocr_num_cpus=3.0)["intra_op_num_threads"] == 3
    assert "intra_op_num_threads" not in ocr_kwargs(replicas=2)
    assert ocr_kwargs(engine_options={"intra_op_num_threads": 6})["intra_op_num_threads"] == 6
    engine = RapidOcrEngine(intra_op_num_threads=1, inter_op_num_threads=1)
    session = engine._ocr.text_det.infer.session
    assert session.get_session_options().intra_op_num_threads == 1  # reaches ONNX Runtime
