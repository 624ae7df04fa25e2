"""Pools that size themselves on real Ray: the PDF job, auto vs static splits vs Ray Data.

    python bench/pool_sizing_ray.py                 # both corpora, 4 declared CPUs, 2 reps
    python bench/pool_sizing_ray.py --quick         # a tiny corpus, one rep, a small grid
    python bench/pool_sizing_ray.py --splits 1:2 3:1  # the grid cut to these static splits

Two corpora, made once under ``.cache/pool_sizing_ray`` from the fetched Debian doc PDFs
(``python scripts/fetch_corpus.py --all``; ``--source DIR`` for another directory of PDFs):

* ``born-digital``: the readable PDFs of the corpus in file order (at most
  ``--max-doc-pages`` pages each), copied until ``--born-pages`` pages (the corpus again,
  as new files, when it runs out): render/text bound, nothing to OCR;
* ``scanned``: image-only copies of the corpus' small PDFs (every page one 150-dpi
  grayscale raster, no text layer: ``bench.region_set.scan_copy``) until ``--scan-pages``
  pages: OCR bound (``--ocr auto`` OCRs every page with RapidOCR).

Each variant is ``rayorch run pdf --json`` in a fresh subprocess (its own private local
Ray); the figures come from the job's summary (``pages_per_s`` after start-up,
``ray_start_s``, ``pools``, ``bound_by``) and the sizer's end-of-run line on stderr (``N
decisions, X ms each``), plus the process' wall time. Every variant of a corpus runs under
the same declared CPUs (``--cpus``, default 4 on any machine): ``RAY_OVERRIDE_RESOURCES``
(Ray's own override, which wins over the ``num_cpus`` the job passes to ``ray.init``) makes
the job's local Ray declare exactly that many, whatever ``ray_size_for`` asks for. Variants:

* ``auto``: the default, no replica flags (render and OCR ``replicas="auto"``);
* ``default``: the job's static default before the pools sized themselves
  (``--render-replicas`` min(8, cores) = 2 on two cores, ``--replicas 1``: c926bbe^1);
* every static split ``--render-replicas R --replicas O`` whose declared CPUs fit
  (render 1 CPU, OCR 0.5, assemble 0.25 a actor: :func:`grid`); the best by median wall;
* ``raydata``: Ray Data on the same declared CPUs doing the same work with the same code
  (``RenderPdf``, ``OcrPage('rapidocr', lazy=True)``, ``AssembleDocument``): render and OCR
  are ``map_batches`` actor pools with ``concurrency=(1, max)`` (Ray Data's autoscaling
  pools), render emits a row per page to OCR and one per document (a flat map), a
  ``groupby(doc).map_groups`` assembles and writes one Markdown per document.

The first round runs every variant once (the grid included), later rounds repeat
``auto``, ``default``, ``raydata`` and the best static split (``--reps`` in all).
Tables go to stdout (markdown), rows to ``<out>/rows.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / ".cache" / "corpus"
CORPORA = ("born-digital", "scanned")
RENDER_CPUS, OCR_CPUS, ASSEMBLE_CPUS = 1.0, 0.5, 0.25
"""What the PDF job's actors declare with ``--ocr auto`` (``pipelines/pdf.py``)."""
DEFAULT_SPLIT = (2, 1)
"""The job's static default before issue 30 on two cores: render min(8, cores), OCR 1."""
DECISIONS = re.compile(r"(\d+) decisions, ([0-9.]+) ms each")
BOUND = re.compile(r"bound by (\w+) \((\d+)% of the decisions' time\)")


# -- pure helpers (tests/unit/test_bench_pool_sizing_ray.py) ----------------------------
def grid(cpus: float, render_cpus: float = RENDER_CPUS, ocr_cpus: float = OCR_CPUS,
         fixed: float = ASSEMBLE_CPUS) -> list[tuple[int, int]]:
    """Every static split ``(render, ocr)``, each at least 1, whose actors' declared CPUs
    (plus ``fixed``: the assemble actor) fit in ``cpus``."""
    splits = []
    render = 1
    while render * render_cpus + ocr_cpus + fixed <= cpus + 1e-9:
        ocr = 1
        while render * render_cpus + ocr * ocr_cpus + fixed <= cpus + 1e-9:
            splits.append((render, ocr))
            ocr += 1
        render += 1
    return splits


def most_actors(cpus: float, need: float, others: float) -> int:
    """The most actors of ``need`` CPUs beside the other stages' minimums (``others``)."""
    return max(1, int((cpus - others + 1e-9) // need))


def variant_name(split: tuple[int, int] | str) -> str:
    """``auto``, ``raydata`` or ``r2:o1`` (render x2, OCR x1)."""
    return split if isinstance(split, str) else f"r{split[0]}:o{split[1]}"


def parse_sizer_line(stderr: str) -> dict[str, Any]:
    """The sizer's end-of-run line (``runtime/pool_sizer.py`` ``summary``): decisions, ms
    each, the binding stage and its share; ``{}`` when the run made no decision."""
    found: dict[str, Any] = {}
    if (m := DECISIONS.search(stderr)) is not None:
        found["decisions"], found["decision_ms"] = int(m.group(1)), float(m.group(2))
    if (m := BOUND.search(stderr)) is not None:
        found["bound_share"] = int(m.group(2)) / 100
    return found


def pick(entries: list[tuple[str, int]], pages: int, max_doc_pages: int,
         min_doc_pages: int = 1, cycle: bool = False) -> list[tuple[int, str, int]]:
    """``(copy, file, pages)`` in order, documents of ``min_doc_pages``-``max_doc_pages``
    pages, until ``pages`` pages; with ``cycle`` the list again (copy 1, 2, ...) when it
    runs out, else fewer pages."""
    usable = [(f, n) for f, n in entries if min_doc_pages <= n <= max_doc_pages]
    chosen: list[tuple[int, str, int]] = []
    total, copy = 0, 0
    while usable and total < pages:
        for f, n in usable:
            if total >= pages:
                break
            chosen.append((copy, f, n))
            total += n
        if not cycle:
            break
        copy += 1
    return chosen


def spread(values: list[float]) -> dict[str, float]:
    """``{"min", "median"}`` of a variant's runs."""
    return {"min": min(values), "median": statistics.median(values)}


def page_rate(row: dict[str, Any]) -> float:
    """Pages per second after start-up: ``pages / run_s`` (the summary's ``pages_per_s`` is
    rounded to 0.1, too coarse for OCR)."""
    if row.get("pages") and row.get("run_s"):
        return float(row["pages"]) / float(row["run_s"])
    return float(row["pages_per_s"])


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: runs, wall and pages/s (min and median), pools, decisions."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        last = mine[-1]
        out[name] = {
            "runs": len(mine), "kind": last["kind"],
            "wall_s": spread([r["wall_s"] for r in mine]),
            "pages_per_s": spread([page_rate(r) for r in mine]),
            "after_ray_pages_per_s": spread([r["after_ray_pages_per_s"] for r in mine]),
            "pools": last.get("pools"),
            "bound_by": "/".join(r.get("bound_by") or "none" for r in mine)
            if any(r.get("bound_by") for r in mine) else None,
            "decisions": [r.get("decisions") for r in mine],
            "decision_ms": [r.get("decision_ms") for r in mine],
        }
    return out


def best_static(stats: dict[str, dict[str, Any]]) -> str | None:
    """The static split with the shortest median wall time."""
    static = [n for n, s in stats.items() if s["kind"] == "static"]
    return min(static, key=lambda n: stats[n]["wall_s"]["median"]) if static else None


def pools_text(pools: dict[str, Any] | None) -> str:
    """``render 1→3→3, ocr 1``: each sizing pool's start, most and end (fixed: its size)."""
    if not pools:
        return ""
    parts = []
    for name in ("render", "ocr"):
        p = pools.get(name)
        if p is None:
            continue
        sizes = [p["start"], p["most"], p["end"]]
        parts.append(f"{name} {p['start']}" if len(set(sizes)) == 1
                     else f"{name} {'→'.join(str(s) for s in sizes)}")
    return ", ".join(parts)


def rate(value: float) -> str:
    """Pages per second: two decimals under 10, one under 100, else a whole number."""
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _ms(values: list[float | None]) -> str:
    shown = [v for v in values if v is not None]
    return "/".join(f"{v:.2f}" for v in shown) if shown else ""


def table(corpus: str, stats: dict[str, dict[str, Any]], *, default: str) -> str:
    """The markdown tables of one corpus: every variant, then auto's ratios."""
    lines = [f"**{corpus}**", "",
             "| variant | runs | wall s (min / median) | pages/s after start-up (min / median) "
             "| pages/s after Ray start (median) | pools (start→most→end) | bound by "
             "| decisions (ms each) |",
             "|---|---:|---:|---:|---:|---|---|---|"]
    best = best_static(stats)
    order = sorted(stats, key=lambda n: ({"auto": 0, "raydata": 2}.get(
        n, 1 if n in (best, default) else 3), n))
    for name in order:
        s = stats[name]
        label = name + (" (default)" if name == default else "") + (
            " (best static)" if name == best else "")
        decisions = [d for d in s["decisions"] if d is not None]
        cost = f" ({_ms(s['decision_ms'])})" if decisions else ""
        lines.append(
            f"| {label} | {s['runs']} | {s['wall_s']['min']:.1f} / {s['wall_s']['median']:.1f} "
            f"| {rate(s['pages_per_s']['min'])} / {rate(s['pages_per_s']['median'])} "
            f"| {rate(s['after_ray_pages_per_s']['median'])} | {pools_text(s['pools'])} "
            f"| {s['bound_by'] or ''} | "
            f"{'/'.join(str(d) for d in decisions)}{cost} |")
    auto = stats.get("auto")
    if auto is None:
        return "\n".join(lines)
    lines += ["", "| auto against | its split | wall: auto / it (median) "
              "| pages/s after start-up: auto / it | pages/s after Ray start: auto / it |",
              "|---|---|---:|---:|---:|"]
    against: list[tuple[str, str | None]] = [
        ("best static", best), ("default static", default), ("Ray Data", "raydata")]
    for label, split in against:
        other = stats.get(split) if split else None
        if other is None:
            continue
        ratios = [auto[key]["median"] / other[key]["median"]
                  for key in ("wall_s", "pages_per_s", "after_ray_pages_per_s")]
        lines.append(f"| {label} | {split} | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    return "\n".join(lines)


# -- corpora ----------------------------------------------------------------------------
def source_entries(source: Path) -> list[tuple[str, int]]:
    """``(path, pages)`` of the PDFs under ``source``: from the fetched packages' manifests
    (file order), else by opening each PDF."""
    manifests = sorted(source.glob("*/manifest.json"))
    if manifests:
        return [(str(m.parent / e["file"]), int(e["pages"])) for m in manifests
                for e in sorted(json.loads(m.read_text())["pdfs"], key=lambda e: e["file"])]
    import pymupdf

    opener: Any = pymupdf.open  # PyMuPDF's annotations are partial
    entries = []
    for path in sorted(source.rglob("*.pdf")):
        with opener(path) as doc:
            entries.append((str(path), doc.page_count))
    return entries


def build(kind: str, directory: Path, entries: list[tuple[str, int]], pages: int,
          max_doc_pages: int) -> tuple[int, int]:
    """The corpus ``kind`` in ``directory`` (made once for the same choice): its documents
    and pages."""
    from bench.region_set import scan_copy

    if kind == "scanned":
        chosen = pick(entries, pages, max_doc_pages, min_doc_pages=2)
    else:
        chosen = pick(entries, pages, max_doc_pages, cycle=True)
    wanted = {"kind": kind, "files": [[c, f] for c, f, _ in chosen]}
    stamp = directory / "set.json"
    if not stamp.exists() or json.loads(stamp.read_text()) != wanted:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for copy, f, _ in chosen:
            target = directory / f"c{copy}-{Path(f).name}"
            if kind == "scanned":
                scan_copy(Path(f), target)
            else:
                shutil.copyfile(f, target)
        stamp.write_text(json.dumps(wanted))
    return len(chosen), sum(n for _, _, n in chosen)


# -- runs -------------------------------------------------------------------------------
def child_env(cpus: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": cpus})}


def run_cli(corpus: Path, cpus: int, split: tuple[int, int] | None, batch_size: int | None,
            timeout_s: float) -> dict[str, Any]:
    """``rayorch run pdf --json`` on ``corpus`` in a fresh process: its summary's figures."""
    out = Path(tempfile.mkdtemp(prefix="pool-sizing-ray-"))
    argv = [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", str(corpus),
            "--output", str(out / "out"), "--json", "--no-progress", "--allow-failures"]
    if split is not None:
        argv += ["--render-replicas", str(split[0]), "--replicas", str(split[1])]
    if batch_size is not None:
        argv += ["--batch-size", str(batch_size)]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env=child_env(cpus), timeout=timeout_s)
    wall = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"rayorch run pdf failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    after_ray = summary["pools_start_s"] + summary["run_s"]
    return {"documents": summary["documents"], "failed": summary["failed"],
            "pages": summary["pages"], "page_engines": summary["page_engines"],
            "ray_start_s": summary["ray_start_s"], "pools_start_s": summary["pools_start_s"],
            "run_s": summary["run_s"], "job_wall_s": summary["wall_s"],
            "pages_per_s": summary["pages_per_s"],
            "after_ray_pages_per_s": summary["pages"] / after_ray if after_ray else 0.0,
            "pools": summary["pools"], "bound_by": summary["bound_by"],
            "wall_s": wall, **parse_sizer_line(done.stderr)}


def run_raydata(corpus: Path, cpus: int, batch_size: int | None,
                timeout_s: float) -> dict[str, Any]:
    """The Ray Data pipeline (:func:`raydata_child`) in a fresh process."""
    out = Path(tempfile.mkdtemp(prefix="pool-sizing-raydata-"))
    argv = [sys.executable, str(Path(__file__).resolve()), "--raydata-child", str(corpus),
            str(out), "--cpus", str(cpus), "--ocr-batch-size", str(batch_size or 16)]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env=child_env(cpus), timeout=timeout_s)
    wall = time.perf_counter() - started
    written = len(list(out.glob("*.md")))
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"the Ray Data run failed ({done.returncode}): {done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "markdown_files": written, "wall_s": wall}


# -- the Ray Data peer (runs in its own process) ----------------------------------------
class RenderRows:
    """Ray Data actor: each PDF -> one ``meta`` row and one row per page to OCR (the flat
    map), with ``RenderPdf(ocr_fallback=True)``: the job's render of ``--ocr auto``."""

    def __init__(self) -> None:
        from rayorch.pipelines.document.render import DEFAULT_DPI, RenderPdf

        self.render = RenderPdf(ocr_fallback=True, dpi=DEFAULT_DPI)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        docs, kinds, blobs = [], [], []
        results = self.render([str(p) for p in batch["path"]])
        for doc, result in zip(batch["doc"], results, strict=True):
            if not isinstance(result, tuple):  # a RecordFailure: the document failed
                docs.append(int(doc))
                kinds.append("failed")
                blobs.append(pickle.dumps(str(result)))
                continue
            to_ocr, meta = result
            docs.append(int(doc))
            kinds.append("meta")
            blobs.append(pickle.dumps(meta))
            for page in to_ocr:
                docs.append(int(doc))
                kinds.append("page")
                blobs.append(pickle.dumps(page))
        return {"doc": np.array(docs, dtype=np.int64), "kind": np.array(kinds, dtype=object),
                "blob": np.array(blobs, dtype=object)}


class OcrRows:
    """Ray Data actor: the page rows through ``OcrPage('rapidocr', lazy=True)`` (the job's
    OCR actor for ``--ocr auto``), the other rows unchanged."""

    def __init__(self) -> None:
        from rayorch.pipelines.document.page_ocr import OcrPage

        self.ocr = OcrPage("rapidocr", lazy=True)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        at = [i for i, kind in enumerate(batch["kind"]) if kind == "page"]
        if at:
            texts = self.ocr([pickle.loads(batch["blob"][i]) for i in at])
            blobs = list(batch["blob"])
            for i, text in zip(at, texts, strict=True):
                blobs[i] = pickle.dumps(text)
            batch["blob"] = np.array(blobs, dtype=object)
        return batch


def assemble_group(group: Any, out_dir: str) -> Any:
    """map_groups: one document's rows -> its Markdown file (``AssembleDocument``)."""
    import pandas as pd

    from rayorch.pipelines.document.assemble import AssembleDocument

    doc = int(group["doc"].iloc[0])
    kinds = list(group["kind"])
    if "meta" not in kinds:
        return pd.DataFrame([{"doc": doc, "pages": 0, "failed": 1}])
    meta = pickle.loads(group["blob"].iloc[kinds.index("meta")])
    texts = [pickle.loads(b) for k, b in zip(kinds, group["blob"], strict=True) if k == "page"]
    [result] = AssembleDocument()([texts], [meta])
    name = f"{doc:05d}-{Path(str(meta['path'])).stem}.md"
    Path(out_dir, name).write_text(result["markdown"], encoding="utf-8")
    return pd.DataFrame([{"doc": doc, "pages": result["pages"], "failed": 0,
                          "ocr_pages": len(texts)}])


def raydata_child(corpus: Path, out_dir: Path, cpus: int, batch_size: int) -> dict[str, Any]:
    """Run the Ray Data pipeline over ``corpus`` on a private local Ray of ``cpus`` CPUs."""
    import ray

    from rayorch.pipelines.pdf import list_pdfs

    started = time.perf_counter()
    ray.init(address="local", num_cpus=cpus, include_dashboard=False,
             log_to_driver=False, logging_level=logging.WARNING)
    ray_start = time.perf_counter() - started
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.shuffle_strategy = ray.data.context.ShuffleStrategy("sort_shuffle_pull_based")
    # Largest first, as the job orders its sources (big_first).
    files = sorted(list_pdfs(str(corpus)), key=lambda item: (-item[1], item[0]))
    items = [{"doc": i, "path": item.name} for i, item in enumerate(files)]
    t0 = time.perf_counter()
    ds: Any = ray.data.from_items(items, override_num_blocks=min(len(items), 4 * cpus))
    ds = ds.map_batches(RenderRows, batch_size=2, num_cpus=RENDER_CPUS,
                        concurrency=(1, most_actors(cpus, RENDER_CPUS,
                                                    OCR_CPUS + ASSEMBLE_CPUS)))
    ds = ds.map_batches(OcrRows, batch_size=batch_size, num_cpus=OCR_CPUS,
                        concurrency=(1, most_actors(cpus, OCR_CPUS,
                                                    RENDER_CPUS + ASSEMBLE_CPUS)))
    ds = ds.groupby("doc", num_partitions=cpus).map_groups(
        functools.partial(assemble_group, out_dir=str(out_dir)), batch_format="pandas",
        num_cpus=ASSEMBLE_CPUS)
    documents = pages = failed = ocr_pages = 0
    for row in ds.iter_rows():
        documents += 1
        pages += int(row["pages"])
        failed += int(row["failed"])
        ocr_pages += int(row.get("ocr_pages") or 0)
    run_s = time.perf_counter() - t0
    ray.shutdown()
    return {"documents": documents, "failed": failed, "pages": pages,
            "ocr_pages": ocr_pages, "ray_start_s": ray_start, "run_s": run_s,
            "pages_per_s": pages / run_s, "after_ray_pages_per_s": pages / run_s}


# -- the sweep --------------------------------------------------------------------------
def sweep(corpus: str, directory: Path, docs: int, pages: int, args: argparse.Namespace,
          log: Any, save: Any) -> list[dict[str, Any]]:
    """Every variant of one corpus, ``args.reps`` rounds (the grid only in the first);
    ``save(rows)`` after each run."""
    splits = grid(args.cpus)
    if args.splits:  # only these static splits (and the default), e.g. a re-run of the best
        wanted = {tuple(int(x) for x in text.split(":")) for text in args.splits}
        splits = [s for s in splits if s in wanted]
    if args.quick:
        splits = [s for s in splits if s in (DEFAULT_SPLIT, (1, 1), (1, 3))]
    default = variant_name(DEFAULT_SPLIT)
    batch = args.scan_batch_size if corpus == "scanned" else None
    rows: list[dict[str, Any]] = []

    def one(name: str, kind: str, rep: int) -> None:
        log(f"{corpus}: {name} (round {rep + 1}) ...")
        if name == "raydata":
            row = run_raydata(directory, args.cpus, batch, args.timeout)
        else:
            split = None if name == "auto" else tuple(
                int(x[1:]) for x in name.split(":"))
            row = run_cli(directory, args.cpus, split, batch,  # type: ignore[arg-type]
                          args.timeout)
        row.update(corpus=corpus, variant=name, kind=kind, rep=rep, cpus=args.cpus,
                   ocr_batch_size=batch or 16,
                   corpus_documents=docs, corpus_pages=pages,
                   loadavg=Path("/proc/loadavg").read_text().split()[:3])
        if row["documents"] != docs or row["pages"] != pages or row["failed"]:
            log(f"  MISMATCH: {row['documents']} documents / {row['pages']} pages / "
                f"{row['failed']} failed, expected {docs} / {pages} / 0")
        log(f"  wall {row['wall_s']:.1f}s, {row['pages_per_s']:.1f} pages/s, "
            f"pools {pools_text(row.get('pools'))}, decisions {row.get('decisions')}")
        rows.append(row)
        save(rows)

    for rep in range(args.reps):
        named = ["auto", default, "raydata"]
        if rep == 0:
            todo = [*named, *(variant_name(s) for s in splits if variant_name(s) != default)]
        else:
            best = best_static(summarize(rows))
            todo = [*named, *([best] if best not in (None, default) else [])]
        for name in todo:
            kind = "auto" if name == "auto" else "raydata" if name == "raydata" else "static"
            one(name, kind, rep)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cpus", type=int, default=4,
                        help="CPUs every run's Ray declares (default 4)")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--splits", nargs="+", metavar="R:O",
                        help="run only these static splits of the grid (and the default)")
    parser.add_argument("--corpus", nargs="+", default=list(CORPORA), choices=CORPORA)
    parser.add_argument("--source", type=Path, default=SOURCE,
                        help="the PDFs the corpora are made from (default .cache/corpus)")
    parser.add_argument("--born-pages", type=int, default=3000)
    parser.add_argument("--scan-pages", type=int, default=32)
    parser.add_argument("--scan-batch-size", type=int, default=4,
                        help="pages per OCR batch on the scanned corpus (--batch-size; the "
                        "job's default 16 makes 3 batches of 37 pages: no pool of more "
                        "than 3 OCR actors could be used)")
    parser.add_argument("--ocr-batch-size", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--max-doc-pages", type=int, default=200)
    parser.add_argument("--max-scan-doc-pages", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "pool_sizing_ray")
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "pool_sizing_ray")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny corpus (300 + 4 pages), one round, 3 static splits")
    parser.add_argument("--tables-from", type=Path, metavar="ROWS_JSON",
                        help="only print the tables of an earlier run's rows.json")
    parser.add_argument("--raydata-child", nargs=2, metavar=("CORPUS", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.raydata_child:
        corpus, out = (Path(p) for p in args.raydata_child)
        print(json.dumps(raydata_child(corpus, out, args.cpus, args.ocr_batch_size)),
              flush=True)
        return 0
    if args.tables_from:
        print(tables(json.loads(args.tables_from.read_text())))
        return 0
    if args.quick:
        args.born_pages, args.scan_pages, args.reps = 300, 4, 1
        args.cache = args.cache / "quick"
        args.out = args.out / "quick"

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def write(data: dict[str, Any]) -> None:  # after every run: a cut-short sweep keeps its rows
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rows.json").write_text(json.dumps(data, indent=1))

    if not args.source.is_dir():
        sys.exit(f"no PDFs at {args.source}: python scripts/fetch_corpus.py --all, or --source")
    entries = source_entries(args.source)
    started = time.perf_counter()
    load_before = Path("/proc/loadavg").read_text().strip()
    rows: list[dict[str, Any]] = []
    corpora: dict[str, dict[str, int]] = {}
    for corpus in args.corpus:
        directory = args.cache / corpus
        pages_wanted = args.scan_pages if corpus == "scanned" else args.born_pages
        most = args.max_scan_doc_pages if corpus == "scanned" else args.max_doc_pages
        docs, pages = build(corpus, directory, entries, pages_wanted, most)
        corpora[corpus] = {"documents": docs, "pages": pages}
        log(f"{corpus}: {docs} documents, {pages} pages under {directory}")
        earlier = list(rows)
        rows += sweep(corpus, directory, docs, pages, args, log,
                      lambda mine, earlier=earlier: write(
                          {"cpus": args.cpus, "corpora": corpora, "rows": earlier + mine}))
    load_after = Path("/proc/loadavg").read_text().strip()
    write({"cpus": args.cpus, "corpora": corpora, "load_before": load_before,
           "load_after": load_after, "seconds": time.perf_counter() - started, "rows": rows})
    print(f"Declared CPUs: {args.cpus} on {os.cpu_count()} cores; load before: {load_before}; "
          f"after: {load_after}; {time.perf_counter() - started:.0f} s\n")
    print(tables({"corpora": corpora, "rows": rows}))
    return 0


def tables(data: dict[str, Any]) -> str:
    """Every corpus' tables from ``rows.json``'s contents."""
    parts = []
    for corpus, c in data["corpora"].items():
        mine = [r for r in data["rows"] if r["corpus"] == corpus]
        if mine:
            parts.append(f"{corpus}: {c['documents']} documents, {c['pages']} pages\n\n"
                         + table(corpus, summarize(mine), default=variant_name(DEFAULT_SPLIT)))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.exit(main())
