"""A short real-engine benchmark: vLLM (CPU or GPU build) on the test VLM, two ways.

    python -m bench.vllm_engine [--model DIR] [--pages 24] [--batch-size 8] [--json PATH]

1. **engine**: ``VllmEngine`` called directly in this process on ``--pages`` rendered pages
   (the sample PDFs' first pages, repeated), in batches of ``--batch-size``: the engine's
   build time and pages/s after it.
2. **job**: ``rayorch run pdf --ocr vllm --model DIR`` (a subprocess, its own private Ray) on
   four small sample PDFs (17 pages) or ``--job-input DIR``: E2E, start-up and pages/s after
   start-up from its ``--json`` summary. It runs first (its engine is gone before the
   in-process one is built).

``--model`` defaults to the kit's VLM (``rayorch.testmodels``, built under
``.cache/test-models``). With random weights a page's answer runs to ``--max-tokens`` or
an early end token, so the figures measure the engine path, not a real model's speed.
Prints one JSON line (and writes it to ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PDFS = REPO / "examples" / "pdfs"


def rendered_pages(count: int) -> list[dict[str, Any]]:
    """``count`` rendered pages (PNG attached): the sample PDFs' pages, repeated."""
    from rayorch.pipelines.pdf import RenderPdf

    render = RenderPdf(needs_image=True)
    pool: list[dict[str, Any]] = []
    for (pages, _meta) in render(sorted(str(p) for p in PDFS.glob("*.pdf"))[:3]):
        pool.extend(pages[:4])
    return [pool[i % len(pool)] for i in range(count)]


def engine_figures(model: str, pages: list[dict[str, Any]], batch_size: int,
                   max_tokens: int) -> dict[str, Any]:
    from rayorch.pipelines.document.ocr import VllmEngine

    started = time.perf_counter()
    engine = VllmEngine(model=model, max_tokens=max_tokens)
    built = time.perf_counter()
    texts = []
    for i in range(0, len(pages), batch_size):
        texts.extend(engine.recognize(pages[i:i + batch_size]))
    done = time.perf_counter()
    assert len(texts) == len(pages)
    return {"engine_build_s": round(built - started, 2), "engine_pages": len(pages),
            "engine_run_s": round(done - built, 2),
            "engine_pages_per_s": round(len(pages) / (done - built), 2)}


JOB_PDFS = ("gb4e-doc.pdf", "phonrule-doc.pdf", "poemscol-cheatsheet.pdf", "qtree-qarrows.pdf")


def job_figures(model: str, batch_size: int, source: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ro-vllm-bench-") as tmp:
        if source is None:
            source = str(Path(tmp) / "in")
            Path(source).mkdir()
            for name in JOB_PDFS:
                shutil.copyfile(PDFS / name, Path(source) / name)
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        proc = subprocess.run(
            [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", source,
             "--output", str(Path(tmp) / "out"), "--ocr", "vllm", "--model", model,
             "--batch-size", str(batch_size), "--no-progress", "--json"],
            env=env, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"rayorch run pdf failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout)
    return {"job_pages": summary["pages"], "job_wall_s": summary["wall_s"],
            "job_startup_s": summary["startup_s"], "job_run_s": summary["run_s"],
            "job_pages_per_s": summary["pages_per_s"], "job_failed": summary["failed"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a VLM directory (default: the kit's)")
    parser.add_argument("--pages", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--skip-job", action="store_true", help="the engine figures only")
    parser.add_argument("--job-input", default=None, help="PDFs for the job (default: 4 small)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from rayorch.pipelines.vllm_runtime import vllm_distribution, vllm_is_cpu_build

    model = args.model
    if model is None:
        from rayorch.testmodels import build

        root = os.environ.get("RAYORCH_TEST_MODELS") or str(REPO / ".cache" / "test-models")
        model = str(build("vlm", root))
    result: dict[str, Any] = {"vllm": vllm_distribution(), "cpu_build": vllm_is_cpu_build(),
                              "model": model, "batch_size": args.batch_size,
                              "max_tokens": args.max_tokens}
    if not args.skip_job:
        result.update(job_figures(model, args.batch_size, args.job_input))
    result.update(engine_figures(model, rendered_pages(args.pages), args.batch_size,
                                 args.max_tokens))
    line = json.dumps(result)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    return result


if __name__ == "__main__":
    main()
