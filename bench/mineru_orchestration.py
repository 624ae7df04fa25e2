"""MinerU2.5's two steps, three orchestrations, one engine: rayorch's ``--ocr mineru`` beside
mineru-vl-utils' own "stepping" and "concurrent" modes.

    python -m bench.mineru_orchestration --model DIR [--docs 16] [--repeat 3] [--quick]

``DIR`` is the test-model kit's ``mineru`` model (``python -m rayorch.testmodels DIR --kind
mineru``). Every mode runs the same engine (vLLM in-process, the options in :data:`ENGINE`),
the same PDFs (pieces of the example PDFs, 1 to 6 pages), the same prompts and sampling
(greedy, MinerU's penalties) and the test-only regexes
(:data:`rayorch.pipelines.document.mineru_blocks.TEST_REGEXES`), so that random weights give
every request a short valid answer and the three do the same work:

* ``rayorch``: ``PdfPipeline("mineru")`` on Ray (render, then one ``MineruEngine`` actor
  serving both steps, ``max_inflight`` batches at once, no retry), warmed on one document
  first (an ``ro.Executor``), its engine's request log read from a file;
* ``stepping``: every page rendered, then ``MinerUClient.aio_stepping_two_step_extract``: one
  batch of all the layouts, then one of all the blocks;
* ``concurrent``: every page rendered, then one ``aio_two_step_extract`` chain per page under
  one ``asyncio.Semaphore(100)`` (what ``aio_concurrent_two_step_extract`` runs), timed per
  page.

mineru-vl-utils' modes run on their client (:class:`EngineClient`: their request in, the
engine's answer out) over this process's engine. Per mode: E2E (rendering included), the
first document done, the engine busy fraction (time with a request inside / E2E) and the mean
requests inside while busy, from each request's entry and exit.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.simulator.engine import merge_intervals

REPO = Path(__file__).resolve().parent.parent
ENGINE: dict[str, Any] = {"max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20,
                          "enforce_eager": True}
"""The engine every mode builds (``vllm.LLM`` options beside the model)."""
MAX_TOKENS = 256
PAGES = (1, 3, 2, 6, 1, 4, 2, 5)
"""Pages per document, in turn (long-tailed, as corpora are)."""


def make_corpus(folder: Path, docs: int) -> list[str]:
    """``docs`` PDFs cut from the example PDFs (text, tables of glosses, verse)."""
    pymupdf: Any = __import__("pymupdf")
    sources = [REPO / "examples" / "pdfs" / name for name in
               ("verse.pdf", "parallel.pdf", "gb4e-doc.pdf", "expex-doc.pdf")]
    paths = []
    for d in range(docs):
        with pymupdf.open(sources[d % len(sources)]) as src, pymupdf.open() as out:
            first = (3 * d) % max(1, len(src) - PAGES[d % len(PAGES)])
            out.insert_pdf(src, from_page=first, to_page=first + PAGES[d % len(PAGES)] - 1)
            path = folder / f"doc{d:02d}.pdf"
            out.save(path)
            paths.append(str(path))
    return paths


def engine_figures(records: list[dict[str, Any]], start: float, end: float
                   ) -> dict[str, float]:
    """Busy fraction of ``[start, end]`` and mean requests inside while busy."""
    spans = [(max(r["enqueued"], start), min(r["finished"], end)) for r in records
             if r["finished"] > start and r["enqueued"] < end]
    busy = sum(b - a for a, b in merge_intervals(spans))
    inside = sum(b - a for a, b in spans)
    return {"busy_fraction": busy / (end - start), "mean_inside": inside / busy if busy else 0.0,
            "requests": len(spans)}


# -- rayorch -------------------------------------------------------------------------------

class RayorchMode:
    """``PdfPipeline("mineru")`` on an ``ro.Executor``: its actor and engine start once (on
    a warm-up document) and serve every timed run."""

    def __init__(self, model: str, warm: str, batch_size: int, inflight: int) -> None:
        import rayorch as ro
        from rayorch.pipelines.document.mineru_blocks import TEST_REGEXES
        from rayorch.pipelines.pdf import PdfPipeline
        from rayorch.runtime.ray_cluster import ensure_ray

        self.log = Path(tempfile.mkdtemp(prefix="mineru-bench-")) / "requests.jsonl"
        from rayorch.pipelines.vllm_runtime import gpu_count

        ensure_ray("local", num_cpus=4, num_gpus=gpu_count() or None, log_to_driver=False)
        pipeline = PdfPipeline(
            "mineru", batch_size=batch_size, ocr_inflight=inflight, render_replicas=1,
            engine_options={"model": model, "max_tokens": MAX_TOKENS, "retries": 0,
                            "test_regexes": TEST_REGEXES, "request_log": str(self.log),
                            **ENGINE})
        self.executor: Any = ro.Executor(pipeline)
        self.executor.run([warm], quiet=True)  # the engine loads here, outside the timing

    def run(self, pdfs: list[str]) -> dict[str, Any]:
        start = time.monotonic()
        done: list[float] = []
        pages = 0
        for _index, value in self.executor.iterate(pdfs, ordered=False, quiet=True,
                                                   progress=False):
            if not isinstance(value, dict):
                raise SystemExit(f"rayorch: a document failed: {value}")
            done.append(time.monotonic())
            pages += int(value["pages"])
        end = time.monotonic()
        records = [json.loads(line) for line in self.log.read_text().splitlines()]
        return {"mode": "rayorch", "pages": pages, "e2e_s": end - start,
                "first_doc_s": min(done) - start, **engine_figures(records, start, end)}

    def close(self) -> None:
        self.executor.close()


# -- mineru-vl-utils' orchestrations -------------------------------------------------------

class EngineClient:
    """mineru-vl-utils' client interface over this process's engine: each request (image,
    prompt, MinerU's sampling) becomes one request of the shared in-process engine (the same
    conversation, sampling and test regex as ``MineruEngine`` sends), timed."""

    def __init__(self, model: str) -> None:
        from rayorch.pipelines.document.mineru_blocks import PROMPT_KEYS, prompts_for
        from rayorch.pipelines.document.ocr import ContinuousChat, VllmChat

        self.chat = ContinuousChat(VllmChat(model, images=1, limit_mm_per_prompt={
            "image": 1, "video": 0}, **ENGINE))
        self.key_of = {prompt: key for key, prompt in prompts_for().items()}
        assert set(self.key_of.values()) == set(PROMPT_KEYS)
        self.records: list[dict[str, Any]] = []

    def _sampling(self, key: str, params: Any) -> Any:
        import vllm
        from vllm.sampling_params import StructuredOutputsParams

        from rayorch.pipelines.document.mineru_blocks import TEST_REGEXES

        return vllm.SamplingParams(
            temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            repetition_penalty=params.repetition_penalty, max_tokens=MAX_TOKENS,
            skip_special_tokens=False,
            structured_outputs=StructuredOutputsParams(regex=TEST_REGEXES[key]))

    async def aio_predict(self, image: Any, prompt: str = "", sampling_params: Any = None,
                          priority: int | None = None) -> str:
        from rayorch.pipelines.document.mineru_blocks import SYSTEM_PROMPT
        from rayorch.pipelines.document.ocr import png_data_url

        if not isinstance(image, bytes):
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            image = buffer.getvalue()
        key = self.key_of[prompt]
        conversation: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": [
                            {"type": "image_url", "image_url": {"url": png_data_url(image)}},
                            {"type": "text", "text": prompt}]}]
        [(out, enqueued, finished)] = await self.chat.timed_outputs(
            [conversation], self._sampling(key, sampling_params))
        self.records.append({"key": key, "enqueued": enqueued, "finished": finished})
        return str(out.outputs[0].text)

    async def aio_batch_predict(self, images: Any, prompts: Any = "", sampling_params: Any = None,
                                priority: Any = None, semaphore: Any = None, use_tqdm: bool = False,
                                tqdm_desc: str | None = None) -> list[str]:
        count = len(images)
        prompts = [prompts] * count if isinstance(prompts, str) else list(prompts)
        params = (list(sampling_params) if isinstance(sampling_params, list | tuple)
                  else [sampling_params] * count)
        semaphore = semaphore or asyncio.Semaphore(100)

        async def one(image: Any, prompt: str, param: Any) -> str:
            async with semaphore:
                return await self.aio_predict(image, prompt, param)

        return list(await asyncio.gather(*(one(i, p, s) for i, p, s in
                                           zip(images, prompts, params, strict=True))))


def mineru_client(engine: EngineClient) -> Any:
    """mineru-vl-utils' ``MinerUClient`` (prompts, parsers, orchestration) on ``engine``."""
    from loguru import logger
    from mineru_vl_utils import MinerUClient

    logger.disable("mineru_vl_utils")
    client = MinerUClient(backend="http-client", server_url="http://127.0.0.1:9",
                          model_name="bench", skip_model_name_checking=True, use_tqdm=False)
    client.client = engine  # its requests go to the shared engine, not over HTTP
    return client


def rendered(pdfs: list[str]) -> list[tuple[int, Any]]:
    """Every page as ``(document, PIL image)``, rendered as rayorch renders them (144 dpi)."""
    from PIL import Image

    from rayorch.pipelines.document.region_render import RenderLayoutPages

    render = RenderLayoutPages()
    return [(d, Image.open(io.BytesIO(page["png"])))
            for d, (pages, _numbers, _meta) in enumerate(render(pdfs)) for page in pages]


def run_mineru(mode: str, engine: EngineClient, pdfs: list[str]) -> dict[str, Any]:
    client = mineru_client(engine)
    engine.records.clear()
    start = time.monotonic()
    pages = rendered(pdfs)
    images = [image for _, image in pages]

    async def stepping() -> list[float]:
        await client.aio_stepping_two_step_extract(images, semaphore=asyncio.Semaphore(100))
        return [time.monotonic()] * len(images)

    async def concurrent() -> list[float]:
        semaphore = asyncio.Semaphore(100)

        async def page(image: Any) -> float:
            await client.aio_two_step_extract(image, semaphore=semaphore)
            return time.monotonic()

        return list(await asyncio.gather(*(page(image) for image in images)))

    ended = asyncio.run(stepping() if mode == "stepping" else concurrent())
    end = time.monotonic()
    per_doc: dict[int, float] = {}
    for (doc, _), at in zip(pages, ended, strict=True):
        per_doc[doc] = max(per_doc.get(doc, 0.0), at)
    return {"mode": mode, "pages": len(pages), "e2e_s": end - start,
            "first_doc_s": min(per_doc.values()) - start,
            **engine_figures(engine.records, start, end)}


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median of a mode's runs."""
    import statistics

    return {key: (statistics.median(r[key] for r in rows) if key != "mode" else rows[0][key])
            for key in rows[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the kit's mineru model directory")
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each mode, taken in turn (the table shows medians)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--modes", default="rayorch,stepping,concurrent")
    parser.add_argument("--quick", action="store_true", help="4 documents, one run each")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    folder = Path(tempfile.mkdtemp(prefix="mineru-corpus-"))
    pdfs = make_corpus(folder, 4 if args.quick else args.docs)
    warm = str(REPO / "examples" / "pdfs" / "qtree-qarrows.pdf")
    modes = args.modes.split(",")
    rayorch = (RayorchMode(args.model, warm, args.batch_size, args.inflight)
               if "rayorch" in modes else None)
    engine = None
    if any(m != "rayorch" for m in modes):
        engine = EngineClient(args.model)
        asyncio.run(mineru_client(engine).aio_two_step_extract(rendered([warm])[0][1]))
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        for _ in range(1 if args.quick else args.repeat):
            for mode in modes:  # in turn: a load that comes and goes hits each mode alike
                row = (rayorch.run(pdfs) if mode == "rayorch" and rayorch is not None
                       else run_mineru(mode, engine, pdfs))  # type: ignore[arg-type]
                runs[mode].append(row)
                print(json.dumps(row), flush=True)
    finally:
        if rayorch is not None:
            rayorch.close()
    rows = [median_row(runs[mode]) for mode in modes]
    print(f"\n{len(pdfs)} documents, {rows[0]['pages']} pages; the kit's mineru model, "
          f"max_tokens {MAX_TOKENS}, test regexes; rayorch batch {args.batch_size}, "
          f"max_inflight {args.inflight}; medians of {len(runs[modes[0]])} runs")
    print("| orchestration | E2E s | first document s | engine busy | mean requests inside "
          "| requests |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['mode']} | {r['e2e_s']:.1f} | {r['first_doc_s']:.1f} | "
              f"{r['busy_fraction']:.1%} | {r['mean_inside']:.1f} | {r['requests']:.0f} |")
    by_mode = {r["mode"]: r for r in rows}
    if "rayorch" in by_mode:
        for other in (m for m in modes if m != "rayorch"):
            o, r = by_mode[other], by_mode["rayorch"]
            print(f"rayorch / {other}: E2E x{r['e2e_s'] / o['e2e_s']:.2f}, first document "
                  f"x{r['first_doc_s'] / o['first_doc_s']:.2f}, busy "
                  f"x{r['busy_fraction'] / o['busy_fraction']:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "medians": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
