"""The engine busy fraction with a real vLLM engine on this machine (``engine_busy.py real``).

A user pipeline (docs -> rendered page images -> a VLM stage -> reduce) runs the kit's tiny
VLM (``python -m rayorch.testmodels DIR``) in one Ray actor, in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), twice on the same pages:

* ``sync``: one ``LLM.chat`` per batch (``max_inflight=1``, rayorch's default pool: one batch
  running, one queued);
* ``inflight``: ``async def __call__`` with ``max_inflight=N``: the batches' requests share
  the engine (``rayorch.pipelines.document.ocr.ContinuousChat``).

Each page asks for a long-tailed number of tokens (``ignore_eos``: random weights would stop
anywhere). Every request's entry and exit times come back with its output; the busy
fraction is the union of the time with a request inside the engine over the stage's window
after start-up (first request in -> last request out).
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import rayorch as ro
from rayorch import F


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the kit's vlm directory")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="sync,inflight")
    parser.add_argument("--out", type=Path, default=Path("bench/out"))


def page_image(doc: int, page: int) -> bytes:
    """A 64x64 'rendered page': a few lines of dark text-like bars on white."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64), "white")
    draw = ImageDraw.Draw(image)
    rng = random.Random(doc * 1000 + page)
    for line in range(rng.randint(0, 7)):
        draw.rectangle((4, 4 + 8 * line, 4 + rng.randint(10, 56), 8 + 8 * line), fill="black")
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def corpus(docs: int, seed: int) -> list[tuple[int, list[int]]]:
    """``(doc, [max_tokens per page])``: 1-12 pages per doc, lognormal tokens (median 24,
    2..256: a blank page versus a dense one)."""
    rng = random.Random(seed)
    return [(d, [int(min(256, max(2, rng.lognormvariate(0.0, 1.0) * 24)))
                 for _ in range(rng.choice((1, 1, 2, 3, 4, 6, 8, 12)))]) for d in range(docs)]


class Render:
    def __call__(self, docs: list[Any]) -> list[Any]:
        return [[{"page": k, "png": page_image(d, k), "max_tokens": n}
                 for k, n in enumerate(tokens)] for d, tokens in docs]


def _engine(model: str) -> Any:
    from rayorch.pipelines.vllm_runtime import prepare_vllm, use_in_process_engine

    use_in_process_engine()
    prepare_vllm()
    from rayorch.pipelines.document.ocr import VllmChat

    return VllmChat(model, images=1, max_tokens=16, gpu_memory_utilization=0.05,
                    max_model_len=1024, distributed_executor_backend="uni",
                    enforce_eager=True)


def _requests(pages: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    import vllm

    from rayorch.pipelines.document.ocr import build_vlm_messages

    conversations = [build_vlm_messages(page, "read the page") for page in pages]
    sampling = [vllm.SamplingParams(temperature=0.0, max_tokens=page["max_tokens"],
                                    ignore_eos=True) for page in pages]
    return conversations, sampling


class SyncVlm:
    """One ``LLM.chat`` per batch: every request enters at the call, leaves at its end."""

    def __init__(self, model: str) -> None:
        self.chat = _engine(model)

    def __call__(self, pages: list[dict[str, Any]]) -> list[Any]:
        conversations, sampling = _requests(pages)
        entered = time.monotonic()
        outs = self.chat.llm.chat(conversations, sampling, use_tqdm=False)
        left = time.monotonic()
        return [(len(o.outputs[0].token_ids), entered, left) for o in outs]


class InflightVlm:
    """Several batches in flight: their requests share the engine (ContinuousChat)."""

    def __init__(self, model: str) -> None:
        from rayorch.pipelines.document.ocr import ContinuousChat

        self.chat = ContinuousChat(_engine(model))

    async def __call__(self, pages: list[dict[str, Any]]) -> list[Any]:
        conversations, sampling = _requests(pages)
        timed = await self.chat.timed_outputs(conversations, sampling)
        return [(len(o.outputs[0].token_ids), entered, left) for o, entered, left in timed]


class Gather:
    def __call__(self, pages: list[list[Any]]) -> list[Any]:
        return [list(p) for p in pages]


class VlmStage(ro.Pipeline):
    def __init__(self, model: str, inflight: int, batch_size: int) -> None:
        super().__init__()
        self.render = ro.RayModule(Render, num_cpus=0.5, batch_size=4)
        self.vlm = ro.RayModule(InflightVlm if inflight > 1 else SyncVlm, model=model,
                                num_cpus=1, batch_size=batch_size, max_inflight=inflight)
        self.gather = ro.RayModule(Gather, num_cpus=0.25)

    def forward(self, docs: Any) -> Any:
        return self.gather(F.reduce(self.vlm(F.expand(self.render(docs)))))


def busy_figures(records: list[tuple[int, float, float]]) -> dict[str, float]:
    """Busy fraction, window and mean requests inside, from ``(tokens, in, out)``."""
    from bench.simulator.engine import merge_intervals

    first = min(r[1] for r in records)
    last = max(r[2] for r in records)
    busy = sum(end - start for start, end in merge_intervals([(r[1], r[2]) for r in records]))
    window = last - first
    inside = sum(r[2] - r[1] for r in records) / busy if busy else 0.0
    return {"busy_fraction": busy / window, "window_s": window, "mean_inside": inside,
            "tokens": float(sum(r[0] for r in records))}


def run_mode(model: str, docs: list[Any], inflight: int, batch_size: int) -> dict[str, Any]:
    started = time.monotonic()
    run = VlmStage(model, inflight, batch_size).run(docs, progress=False, quiet=True)
    first_doc_s = None
    results = []
    for _, value in run:
        first_doc_s = first_doc_s if first_doc_s is not None else time.monotonic() - started
        results.append(value)
    e2e = time.monotonic() - started
    expected = [len(tokens) for _, tokens in docs]
    if [len(r) for r in results] != expected:
        raise SystemExit(f"inflight={inflight}: wrong pages per doc")
    wanted = [n for _, tokens in docs for n in tokens]
    records = [tuple(p) for doc in results for p in doc]
    if [r[0] for r in records] != wanted:
        raise SystemExit(f"inflight={inflight}: a page got another page's tokens")
    figures = busy_figures(records)  # type: ignore[arg-type]
    pages = len(records)
    return {"max_inflight": inflight, "batch_size": batch_size, "pages": pages,
            "e2e_s": e2e, "first_doc_s": first_doc_s,
            "pages_per_s": pages / figures["window_s"],
            "tokens_per_s": figures["tokens"] / figures["window_s"], **figures}


def run_real(args: argparse.Namespace) -> int:
    import ray.cloudpickle

    from rayorch.runtime.ray_cluster import ensure_ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers lack bench/
    docs = corpus(8 if args.quick else args.docs, args.seed)
    pages = sum(len(t) for _, t in docs)
    print(f"real engine: kit VLM {Path(args.model).name}, {len(docs)} docs, {pages} pages, "
          f"max_tokens lognormal (median 24, 2..256), batch {args.batch_size}", flush=True)
    ensure_ray("local", num_cpus=4, log_to_driver=False)
    rows = []
    for mode in args.modes.split(","):
        inflight = 1 if mode == "sync" else args.inflight
        rows.append(run_mode(args.model, docs, inflight, args.batch_size))
        print(json.dumps(rows[-1]), flush=True)
    print("| mode | busy fraction | mean requests inside | pages/s after start-up | "
          "tokens/s | E2E s | first doc s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        name = "sync LLM.chat per batch" if r["max_inflight"] == 1 else \
            f"max_inflight={r['max_inflight']} (ContinuousChat)"
        print(f"| {name} | {r['busy_fraction']:.1%} | {r['mean_inside']:.1f} | "
              f"{r['pages_per_s']:.2f} | {r['tokens_per_s']:.0f} | {r['e2e_s']:.1f} | "
              f"{r['first_doc_s']:.1f} |")
    if len(rows) == 2:
        ratio = rows[1]["pages_per_s"] / rows[0]["pages_per_s"]
        print(f"max_inflight / sync: pages/s x{ratio:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_busy_real.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit("run it as: python bench/engine_busy.py real --model DIR")
