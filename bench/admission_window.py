"""Largest-first within a read-ahead window against the global order: the cost on the long tail.

The job admits its sources from a streamed listing or manifest
(:class:`~rayorch.pipelines.inputs.InputStream`) and orders them largest first (by size in
bytes) within each window of ``InputSpec.window`` entries (1,000 by default). Before the
stream, the job sorted the whole listing largest first. This bench runs both through the
real admission code, on the simulator's virtual clock (``bench/simulator/engine.py``: the
real driver and kernel, actors that take ``cost`` virtual seconds a batch):

* each corpus is written as a JSONL manifest (``path``, ``size`` = pages x 100 kB) and read
  by ``InputStream`` with ``window`` = 1 (no ordering: listing order), 100, 1,000 (the
  default), 10,000, and the whole corpus (the global order, what the job did before);
* the ids and order the stream gives feed the simulated driver (``IteratorFeed.indexed``,
  as ``run_job`` feeds ``Pipeline.run``), ``max_active_sources`` = 256 (the default).

Two pipelines:

* ``text``: one document-grained stage (``--ocr text``: one actor reads a whole document),
  ``workers`` actors, ``0.2 s + 0.05 s/page`` a document. Bound:
  ``max(total work / workers, largest document)``;
* ``gpu``: the paper's pipeline (``bench/simulator/paper.py``: render a document, its pages
  in batches of 32 on ``workers`` GPUs, assemble). Bound: ``max(paper.lower_bound, the
  largest document's render + a + b*ceil(pages/G) + its assemble)``.

Corpora (seeded): ``paper`` (3,689 documents, 1-427 pages, the paper's shape, in draw
order), ``lognormal`` (median 3 pages, sigma 1.5, capped at 2,000), ``pareto`` (alpha 1.1,
capped at 2,000), ``giants`` (1-20 pages, and 10 documents of 1,000 pages at random
places), ``giants-last`` (the same, the 10 giants last in the listing: the worst case) and
``ascending`` (``lognormal`` listed smallest first). ``tail`` is the makespan minus the
moment the first actor ran out of work for good (how long some actors sat idle at the
end); ``idle between batches``: the mean time an actor waited between its first and its
last batch (work not ready: a GPU waiting on renders); ``largest document alone`` is the
shortest time its own work takes (text: its cost; gpu: the bound's second term).

    python -m bench.admission_window                 # every corpus, 16 and 64 workers
    python -m bench.admission_window --docs 2000 --workers 8 --pipelines text   # quick
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.simulator import paper
from bench.simulator.corpus import corpus_stats, long_tail_counts
from bench.simulator.engine import SimResult, Simulator
from rayorch.core.ids import CallId
from rayorch.core.program import PipelineBase, RayModule
from rayorch.core.tracer import Port
from rayorch.core.udf import Row
from rayorch.pipelines.input_lists import read_input_list
from rayorch.pipelines.inputs import WINDOW, InputSpec, InputStream
from rayorch.runtime.delivery import Row as FeedRow

BYTES_PER_PAGE = 100_000
TEXT_BASE_S = 0.2
TEXT_PER_PAGE_S = 0.05
CORPORA = ("paper", "lognormal", "pareto", "giants", "giants-last", "ascending")
WINDOWS = (100, 1_000, 10_000)
GIANTS = 10
GIANT_PAGES = 1_000
CAP = 2_000


# -- corpora ---------------------------------------------------------------------------------
def corpus(kind: str, docs: int, seed: int = 0) -> list[int]:
    """Page counts in listing order (see the module doc)."""
    rng = random.Random(seed)
    if kind == "paper":
        return long_tail_counts(seed=seed)
    if kind in ("lognormal", "ascending"):
        counts = [min(CAP, max(1, round(rng.lognormvariate(1.0, 1.5)))) for _ in range(docs)]
        return sorted(counts) if kind == "ascending" else counts
    if kind == "pareto":
        return [min(CAP, math.ceil(rng.paretovariate(1.1))) for _ in range(docs)]
    if kind in ("giants", "giants-last"):
        counts = [rng.randint(1, 20) for _ in range(docs - GIANTS)]
        if kind == "giants-last":
            return counts + [GIANT_PAGES] * GIANTS
        for _ in range(GIANTS):
            counts.insert(rng.randrange(len(counts) + 1), GIANT_PAGES)
        return counts
    raise SystemExit(f"unknown corpus {kind!r} (one of {', '.join(CORPORA)})")


def write_manifest(counts: Sequence[int], path: Path) -> None:
    with path.open("w") as f:
        for i, pages in enumerate(counts):
            f.write(json.dumps({"path": f"doc-{i:07d}.pdf", "size": pages * BYTES_PER_PAGE})
                    + "\n")


def admitted(manifest: Path, window: int, counts: Sequence[int],
             scout: int = 0) -> Iterator[FeedRow]:
    """The job's admission order: ``InputStream`` over the manifest, each id's forward
    argument ``(id, pages)`` (the simulated pipelines' document).

    ``scout``: the proposal measured (not built): a second pass over the input keeps the
    ``scout`` largest entries it has seen (a bounded heap) and admission takes those
    first; the stream then skips them. Modelled as if that pass had reached the end of the
    input before they were wanted (listing is far faster than processing): its best case."""
    first: list[tuple[int, int]] = []
    if scout:
        seen = ((listed.size, -position) for position, (listed, _) in
                enumerate(e for page in read_input_list(str(manifest)) for e in page))
        first = [(-p, size) for size, p in heapq.nlargest(scout, seen)]
        for index, _size in first:
            yield index, ((index, counts[index]),), None
    taken = {index for index, _ in first}
    spec = InputSpec(str(manifest), (".pdf",), "PDF", manifest=True, window=window)
    stream = InputStream(spec)
    try:
        for index, _name, identity in stream:
            stream.release(index)
            if index not in taken:
                yield index, ((index, counts[index]),), identity
    finally:
        stream.close()


# -- the text pipeline: one document-grained stage -------------------------------------------
def text(docs: list[paper.Doc]) -> list[int]:
    """A document -> its page count (its Markdown, in the real job)."""
    return [pages for _, pages in docs]


class TextPipeline(PipelineBase):
    def __init__(self, workers: int) -> None:
        super().__init__()
        self.text = RayModule(text, replicas=workers, batch_size=1)

    def forward(self, docs: Port) -> Port:
        out: Port = self.text(docs)
        return out


def text_cost(pages: int) -> float:
    return TEXT_BASE_S + TEXT_PER_PAGE_S * pages


def text_model(call: CallId, rows: Sequence[Row]) -> float:
    return sum(text_cost(row[0][1]) for row in rows)


# -- one run ---------------------------------------------------------------------------------
def run(pipeline: str, workers: int, counts: list[int], manifest: Path,
        window: int, scout: int = 0) -> dict[str, Any]:
    rows = admitted(manifest, window, counts, scout)
    expect: dict[int, Any]
    if pipeline == "text":
        sim = Simulator(TextPipeline(workers).compile(), text_model, 256)
        result = sim.run([], indexed=rows)
        call, expect = "text", {i: n for i, n in enumerate(counts)}
        largest = text_cost(max(counts))
        bound = max(sum(map(text_cost, counts)) / workers, largest)
    else:
        config = paper.SimConfig(gpus=workers)
        sim = Simulator(paper.plan_for(config), paper.cost_model(config),
                        config.max_active_sources)
        result = sim.run([], indexed=rows)
        call, expect = "gpu", {i: (n, True) for i, n in enumerate(counts)}
        big = max(counts)
        largest = (config.render_cost(big) + config.gpu_a_s
                   + config.gpu_b_s * math.ceil(big / workers) + config.assemble_cost(big))
        bound = max(paper.lower_bound(config, counts).total_s, largest)
    got = {i: items[0].value for i, items in result.outputs.items()}
    if got != expect:
        raise SystemExit(f"{pipeline}: wrong outputs ({len(got)}/{len(counts)} documents)")
    first_idle, gaps = idle(result, call)
    return {"makespan_s": result.makespan_s, "bound_s": bound, "largest_s": largest,
            "tail_s": result.makespan_s - first_idle, "gaps_s": gaps,
            "wall_s": result.wall_s}


def idle(result: SimResult, call: CallId) -> tuple[float, float]:
    """When the first of the Call's actors ended its last batch (0 if one never ran), and
    the seconds an actor sat idle between its first and its last batch (mean)."""
    actors = range(result.actors[call])
    first: dict[int, float] = {}
    last: dict[int, float] = dict.fromkeys(actors, 0.0)
    busy: dict[int, float] = dict.fromkeys(actors, 0.0)
    for b in result.batches:
        if b.call == call:
            first[b.actor] = min(first.get(b.actor, b.start_s), b.start_s)
            last[b.actor] = max(last[b.actor], b.end_s)
            busy[b.actor] += b.end_s - b.start_s
    gaps = max(0.0, sum(last[a] - first[a] - busy[a] for a in first) / len(actors))
    return min(last.values()), gaps


def label(window: int, docs: int, scout: int = 0) -> str:
    if scout:
        return f"window {window:,} + the {scout:,} largest first (proposal)"
    if window == 1:
        return "none (listing order)"
    if window >= docs:
        return "global (before)"
    return f"window {window:,}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| corpus | pipeline | workers | order | makespan (s) | / global | / bound "
             "| tail (s) | idle between batches (s/actor) | largest document alone (s) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['corpus']} | {r['pipeline']} | {r['workers']} | {r['order']} | "
            f"{r['makespan_s']:,.1f} | {r['vs_global']:.3f} | {r['vs_bound']:.3f} | "
            f"{r['tail_s']:,.1f} | {r['gaps_s']:,.1f} | {r['largest_s']:,.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=20_000,
                        help="documents of the synthetic corpora (paper: always 3,689)")
    parser.add_argument("--workers", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA), choices=CORPORA)
    parser.add_argument("--pipelines", nargs="+", default=["text", "gpu"],
                        choices=["text", "gpu"])
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS))
    parser.add_argument("--scout", type=int, nargs="*", default=[],
                        help="also: window 1,000 with the K largest admitted first (the "
                             "proposal's best case), for each K given")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/admission_window"))
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.corpora:
            counts = corpus(kind, args.docs, args.seed)
            manifest = Path(tmp) / f"{kind}.jsonl"
            write_manifest(counts, manifest)
            stats = corpus_stats(counts)
            print(f"\n{kind}: {stats['parents']:,} documents, {stats['children']:,} pages, "
                  f"median {stats['median']:.0f}, p99 {stats['p99']:.0f}, max "
                  f"{stats['max']:.0f}, top 5% hold {100 * stats['top5pct_share']:.0f}%",
                  flush=True)
            windows = [1, *(w for w in args.windows if w < len(counts)), len(counts)]
            runs = [(w, 0) for w in windows[:-1]] + [(WINDOW, k) for k in args.scout] \
                + [(windows[-1], 0)]
            for pipeline in args.pipelines:
                for workers in args.workers:
                    group = []
                    for window, scout in runs:
                        r = run(pipeline, workers, counts, manifest, window, scout)
                        group.append({"corpus": kind, "pipeline": pipeline,
                                      "workers": workers, "window": window, "scout": scout,
                                      "order": label(window, len(counts), scout), **r})
                    base = group[-1]
                    for r in group:
                        r["vs_global"] = r["makespan_s"] / base["makespan_s"]
                        r["vs_bound"] = r["makespan_s"] / r["bound_s"]
                    print(table(group), flush=True)
                    rows.extend(group)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "admission_window.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
