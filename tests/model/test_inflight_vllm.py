"""Several batches in flight in one actor sharing one real vLLM engine (``max_inflight`` with
``ContinuousChat``), on the kit's text model: the requests of several batches are inside the
engine at once, every record comes back once and in order with its own answer, and a record
the engine refuses fails alone.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import ray

import rayorch as ro
from rayorch import F
from rayorch.core.outcome import FailedResult
from rayorch.pipelines.vllm_runtime import vllm_num_gpus

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

BATCH = 2


class Answer:
    """An async module: each batch's chunks become requests of the shared engine."""

    def __init__(self, model: str) -> None:
        from rayorch.pipelines.document.ocr import ContinuousChat, VllmChat

        self.chat = ContinuousChat(VllmChat(model, max_model_len=256))

    async def __call__(self, chunks: list[str]) -> list[dict[str, Any]]:
        import vllm

        sampling = vllm.SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True,
                                       logprobs=1)
        outs = await self.chat.outputs([[{"role": "user", "content": c}] for c in chunks],
                                       sampling)
        return [{"chunk": chunk, "tokens": len(out.outputs[0].token_ids),
                 "first_logprob": next(iter(out.outputs[0].logprobs[0].values())).logprob,
                 "peak": self.chat.peak} for chunk, out in zip(chunks, outs)]


def chunks(docs: list[str]) -> list[list[str]]:
    return [doc.split("|") for doc in docs]


class Inflight(ro.Pipeline):
    def __init__(self, model: str) -> None:
        super().__init__()
        self.split = ro.RayModule(chunks, num_cpus=0.1, batch_size=16)
        self.answer = ro.RayModule(Answer, model=model, batch_size=BATCH, max_inflight=3,
                                   num_cpus=1, num_gpus=vllm_num_gpus())

    def forward(self, docs: Any) -> Any:
        return F.reduce(self.answer(F.expand(self.split(docs))))


def test_batches_in_flight_share_one_engine(ray_local: None, test_models: dict[str, Any]) -> None:
    words = ["the", "page", "of", "the", "document", "shows", "a", "table", "and", "a", "list"]
    docs = ["|".join(" ".join(words[(d + k) % len(words):]) or "page" for k in range(n))
            for d, n in enumerate([3, 1, 4, 2, 3])]
    too_long = " ".join(["document"] * 400)  # over max_model_len=256
    docs.insert(2, f"a short one|{too_long}")
    got = Inflight(str(test_models["text"])).run(docs, progress=False).collect()
    assert isinstance(got[2], FailedResult), got[2]  # the refused chunk fails its doc only
    assert "answer[2.1] failed" in got[2].cause and "maximum context length is 256" in got[2].cause
    good = [i for i in range(len(docs)) if i != 2]
    assert [[r["chunk"] for r in got[i]] for i in good] == [docs[i].split("|") for i in good]
    records = [r for i in good for r in got[i]]
    assert all(r["tokens"] == 32 for r in records)
    assert max(r["peak"] for r in records) > BATCH  # several batches inside the engine at once
    by_chunk: dict[str, set[float]] = {}
    for r in records:
        by_chunk.setdefault(r["chunk"], set()).add(round(r["first_logprob"], 4))
    # each input reached the engine: different prompts, different first-token logprobs
    assert len({min(v) for v in by_chunk.values()}) > 1
