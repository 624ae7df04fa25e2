"""A user's pipeline whose module wraps a real vLLM engine (``VllmChat``, as the README
shows), on the test text model: warm across batches and runs, one output per record in
order, failures per record; and an engine that cannot be built is one ``PoolError`` line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

import rayorch as ro
from rayorch import F
from rayorch.actors.pool import PoolError
from rayorch.pipelines.document.ocr import VllmChat
from rayorch.pipelines.vllm_runtime import vllm_num_gpus

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PDFS = Path(__file__).resolve().parents[2] / "examples" / "pdfs"


class Summarize:
    """The README's module, plus what a test needs: each construction is a line in
    ``built_log``; each answer keeps its prompt length and first-token log-probability."""

    def __init__(self, model: str, built_log: str) -> None:
        with open(built_log, "a") as log:
            log.write(f"{os.getpid()}\n")
        self.chat = VllmChat(model, max_tokens=4, sampling={"logprobs": 1})

    def __call__(self, chunks: list[str]) -> list[dict[str, Any]]:
        outputs = self.chat.outputs([[{"role": "user", "content": c}] for c in chunks])
        return [{"chunk": chunk, "prompt_tokens": len(out.prompt_token_ids),
                 "first_logprob": next(iter(out.outputs[0].logprobs[0].values())).logprob}
                for chunk, out in zip(chunks, outputs)]


def paragraphs(docs: list[str]) -> list[list[str]]:
    return [doc.split("\n\n") for doc in docs]


class Notes(ro.Pipeline):
    def __init__(self, model: str, built_log: str) -> None:
        super().__init__()
        self.split = ro.RayModule(paragraphs, num_cpus=0.1)
        self.summarize = ro.RayModule(Summarize, model=model, built_log=built_log,
                                      batch_size=2, num_cpus=1, num_gpus=vllm_num_gpus())

    def forward(self, docs: Any) -> Any:
        return F.reduce(self.summarize(F.expand(self.split(docs))))


def test_a_warm_engine_serves_every_batch_and_run_and_a_long_prompt_fails_alone(
    ray_local: None, test_models: dict[str, Path], redis_url: str, tmp_path: Path,
    audited: Callable[[str, str], bool],
) -> None:
    built_log = tmp_path / "built.log"
    first_docs = [["a page of text", "the second page", "a third page"],
                  ["one short page"],
                  ["a page " * 700, "a fine page"],  # over the model's 1024 tokens
                  ["the second page", "a page of text"]]
    second_docs = [["a scene with a car", "a camera moves"], ["a page of text"]]
    with ro.Executor(Notes(str(test_models["text"]), str(built_log)), store=redis_url) as ex:
        first = ex.run(["\n\n".join(d) for d in first_docs], quiet=True)
        second = ex.run(["\n\n".join(d) for d in second_docs], quiet=True)
    assert built_log.read_text().count("\n") == 1  # one engine: 6 batches, 2 runs

    out = first.outputs
    long = out[2]
    assert isinstance(long, ro.OutputIssue)  # its chunk failed, so the document has no output
    assert long.outcome is ro.ItemOutcome.SUPPRESSED
    assert long.cause.startswith("summarize[2.0] failed: VLLMValidationError: This model's "
                                 "maximum context length is 1024 tokens"), long.cause
    for i in (0, 1, 3):  # the others: one answer per chunk, in chunk order
        assert [a["chunk"] for a in out[i]] == first_docs[i]
    assert [[a["chunk"] for a in doc] for doc in second.outputs] == second_docs

    answers = [a for doc in (*out[:2], out[3], *second.outputs) for a in doc]
    by_chunk: dict[str, set[float]] = {}
    for a in answers:
        by_chunk.setdefault(a["chunk"], set()).add(a["first_logprob"])
    assert all(len(lps) == 1 for lps in by_chunk.values())  # the same input, the same answer
    assert len({lp for lps in by_chunk.values() for lp in lps}) > len(by_chunk) // 2
    assert audited(first.run_id, redis_url) and audited(second.run_id, redis_url)


def test_an_engine_that_cannot_be_built_is_one_pool_error_with_its_cause(
    ray_local: None, test_models: dict[str, Path],
) -> None:
    from rayorch.pipelines.pdf import PdfPipeline

    pipeline = PdfPipeline("vllm", engine_options={"model": str(test_models["vlm"]),
                                                   "max_model_len": 4096})
    handle = pipeline.run([str(PDFS / "qtree-qarrows.pdf")], progress=False, quiet=True)
    with pytest.raises(PoolError) as info:
        handle.collect()
    cause = str(info.value)
    assert "\n" not in cause
    assert cause.startswith("building module 'ocr' in its actor failed: ")
    assert "max_model_len" in cause and "4096" in cause and "1024" in cause, cause
