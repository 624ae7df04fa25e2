"""Incremental re-runs: what a re-run costs next to the first run (docs/topics/REUSE.md, "Reuse").

    python -m bench.reuse [--pdfs 40] [--corpus DIR] [--json FILE]

Two pipelines over N real PDFs, each on a private redis-server (payload files on disk):

* ``text``: the PDF job's pipeline with ``--ocr text`` (render -> pages -> assemble);
* ``model``: the PDF job's renderer (every page rendered to a PNG), then a sleep-modelled
  GPU OCR stage on every page (``a + b * batch`` seconds per batch, 2 actors), then an
  assemble.

Per pipeline, on warm actor pools (one ``ro.Executor`` per program; a warm-up run on two
other PDFs starts them), four timed runs: the first run over 90% of the corpus, a re-run
over all of it (10% new files, reusing the first), a re-run with only the assemble stage's
option changed (reusing the second), an identical re-run (reusing the second). Each run is
timed from ``Executor.run`` to its last output, reading the earlier run's facts included.
The Grains each run executed (dispatched) and reused come from ``rayorch status``'s counts.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import rayorch as ro
from rayorch import F

REPO = Path(__file__).resolve().parents[1]
GPU_A_S, GPU_B_S = 0.05, 0.01  # a batch of B pages "on the GPU" sleeps a + b * B seconds


class SleepGpuOcr:
    """A GPU OCR stage modelled by sleeping; returns one line of text per page."""

    def __call__(self, pages: list[dict[str, Any]]) -> list[str]:
        time.sleep(GPU_A_S + GPU_B_S * len(pages))
        return [f"text of page {page['page']}" for page in pages]


class JoinPages:
    def __init__(self, sep: str = "\n\n") -> None:
        self.sep = sep

    def __call__(self, texts: list[list[str]], metas: list[dict[str, Any]]) -> list[str]:
        return [f"# {meta['title']}{self.sep}" + self.sep.join(t) for t, meta in zip(texts, metas)]


class ModelPdf(ro.Pipeline):
    """render -> every page to the sleep-GPU OCR (batch 16, 2 actors) -> assemble."""

    def __init__(self, sep: str = "\n\n") -> None:
        super().__init__()
        from rayorch.pipelines.pdf import RenderPages

        # Every page goes to OCR with its PNG, as with --ocr rapidocr|vllm: a page's input
        # (and so its digest) is its image.
        self.render = ro.RayModule(RenderPages, needs_image=True, ocr_fallback=False,
                                   num_outputs=3, batch_size=2, replicas=2, num_cpus=1.0)
        self.ocr = ro.RayModule(SleepGpuOcr, batch_size=16, replicas=2, num_cpus=0.25)
        self.assemble = ro.RayModule(JoinPages, sep=sep, batch_size=8, num_cpus=0.25)

    def forward(self, pdfs: Any) -> Any:
        pages, _, meta = self.render(pdfs)
        return self.assemble(F.reduce(self.ocr(F.expand(pages))), meta)


def programs(kind: str) -> tuple[Any, Any]:
    """The program, and the same program with only its assemble stage's option changed."""
    if kind == "text":
        from rayorch.pipelines.pdf import PdfPipeline

        return (PdfPipeline("text", render_replicas=2),
                PdfPipeline("text", render_replicas=2, page_markers=False))
    return ModelPdf(), ModelPdf(sep="\n---\n")


def grains(store_url: str, run_id: str) -> dict[str, dict[str, int]]:
    from rayorch.inspect.status import run_status
    from rayorch.store.registry import open_store

    with open_store(store_url) as store:
        calls = run_status(store, run_id).calls
    return {call: {"ran": c["dispatched"], "reused": c["reused"]} for call, c in calls.items()}


def timed(executor: Any, pdfs: list[str], store: str, **options: Any) -> dict[str, Any]:
    started = time.perf_counter()
    handle = executor.run(pdfs, ordered=False, quiet=True, **options)
    seconds = time.perf_counter() - started
    return {"run_id": handle.run_id, "s": round(seconds, 3), "grains": grains(store, handle.run_id)}


def measure(kind: str, corpus: list[str], warmup: list[str], store: str) -> dict[str, Any]:
    base, changed = programs(kind)
    old = corpus[: len(corpus) - max(1, len(corpus) // 10)]
    rows: dict[str, Any] = {}
    with ro.Executor(base, store=store) as executor:
        executor.run(warmup, quiet=True)
        rows["first"] = timed(executor, old, store)
        rows["new_10pct"] = timed(executor, corpus, store, reuse=rows["first"]["run_id"])
        rows["identical"] = timed(executor, corpus, store, reuse=rows["new_10pct"]["run_id"])
    with ro.Executor(changed, store=store) as executor:
        executor.run(warmup, quiet=True)
        rows["assemble_changed"] = timed(executor, corpus, store,
                                         reuse=rows["new_10pct"]["run_id"])
    first = rows["first"]["s"]
    for row in rows.values():
        row["of_first"] = round(row["s"] / first, 3)
    return {"pdfs": len(corpus), "first_pdfs": len(old), "runs": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pdfs", type=int, default=40)
    parser.add_argument("--corpus", default=str(REPO / ".cache" / "corpus" /
                                                "texlive-humanities-doc"))
    parser.add_argument("--pipelines", default="text,model")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from rayorch.pipelines.pdf import find_pdfs
    from rayorch.runtime.ray_cluster import ensure_ray
    from rayorch.testing import RedisServer

    found = find_pdfs(args.corpus)
    if len(found) < args.pdfs + 2:
        raise SystemExit(f"{args.corpus} holds {len(found)} PDFs; fetch the corpus with "
                         "python scripts/fetch_corpus.py --packages texlive-humanities-doc")
    corpus, warmup = found[: args.pdfs], found[args.pdfs: args.pdfs + 2]
    ensure_ray(None, num_cpus=4, log_to_driver=False)
    result: dict[str, Any] = {"gpu_batch_s": [GPU_A_S, GPU_B_S]}
    with tempfile.TemporaryDirectory(prefix="rayorch-bench-reuse-") as work:
        redis = RedisServer(Path(work))
        redis.start()
        try:
            store = f"{redis.url}?payload_dir={Path(work) / 'payloads'}"
            for kind in args.pipelines.split(","):
                result[kind] = measure(kind, corpus, warmup, store)
        finally:
            redis.stop()
    for kind in args.pipelines.split(","):
        runs = result[kind]["runs"]
        print(f"{kind}: {result[kind]['first_pdfs']} then {result[kind]['pdfs']} PDFs")
        for name, row in runs.items():
            ran = ", ".join(f"{call} {c['ran']} ran/{c['reused']} reused"
                            for call, c in row["grains"].items())
            print(f"  {name:17s} {row['s']:7.2f} s = {row['of_first']:.3f} of the first "
                  f"run; {ran}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    from bench.reuse import main as run  # the classes from bench.reuse, not __main__ (resumable)

    run()
