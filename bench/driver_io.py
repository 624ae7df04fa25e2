"""The driver's own I/O on the PDF job, s3 -> s3 (issue 38 items 1-2), one tree against another.

    python -m bench.driver_io [--docs 300] [--tree main=/work/main] [--tree after=.]
                              [--local] [--memory 10000] [--json FILE]

**I/O.** ``--docs`` one-page PDFs (PyMuPDF, ``rayorch.testing.one_page_pdf``) in a bucket of
a loopback S3 server (``moto_server``; ``$RAYORCH_TEST_S3`` uses a running one) behind a
counting proxy (``rayorch.testing_s3.FaultyProxy``), then ``rayorch run pdf --ocr text``
s3 -> s3 once per ``--tree`` (``PYTHONPATH`` = that tree), one after the other, same
corpus, same machine. Per tree:

* ``downloaded_over_input``: bytes of the GET answers for input objects / input bytes;
* ``requests_per_doc``: every request the run made (all processes), per document;
* ``driver_blocked``: the share of the driver process's life its main thread spent inside
  object-store calls (``ObjectStorage._call``, timed by a ``sitecustomize`` that the bench
  puts on ``PYTHONPATH``; worker threads and Ray's workers are not counted);
* ``docs_per_s``: documents / the run's ``run_s`` (after start-up), from its ``--json``;
* ``driver_main_cpu``, ``driver_process_cpu``: the driver's main thread's CPU time, and all
  its threads', over its life (how near the driver is to bounding the run), with the pools'
  sizes and the stage that bound the run.

``--local``: the same corpus again from a local folder to a local folder (no proxy).

**Memory** (``--memory N``): the driver's Python heap per delivered document
(``tracemalloc``, traced in the driver process) between document 1,000 and ``N`` of a job-
like run: ``Pipeline.run`` with the job's file sink (``OutputDir``: a ``.md`` and a row per
document, local) over N tiny documents, on the ``memory://`` and a ``redis://`` store; the
heap at document 1,000 against document N - 1,000 (both in the steady state: the sources held
active at the start and the end of a run are not growth).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

PROFILE = '''
import atexit, json, os, threading, time
_dir = os.environ.get("RAYORCH_BENCH_PROFILE_DIR")
if _dir:
    from rayorch.storage import objects as _objects
    _orig = _objects.ObjectStorage._call
    _acc = {"blocked_s": 0.0, "calls": 0, "by_what": {}}
    _t0 = time.perf_counter()

    def _call(self, what, key, op):
        if threading.current_thread() is not threading.main_thread():
            return _orig(self, what, key, op)
        t = time.perf_counter()
        try:
            return _orig(self, what, key, op)
        finally:
            dt = time.perf_counter() - t
            _acc["blocked_s"] += dt
            _acc["calls"] += 1
            w = _acc["by_what"].setdefault(what, [0, 0.0])
            w[0] += 1
            w[1] += dt

    _objects.ObjectStorage._call = _call

    def _dump():  # atexit: on the main thread
        _acc["life_s"] = time.perf_counter() - _t0
        _acc["main_cpu_s"] = time.thread_time()
        _acc["process_cpu_s"] = time.process_time()
        with open(os.path.join(_dir, f"{os.getpid()}.json"), "w") as f:
            json.dump(_acc, f)

    atexit.register(_dump)
'''


def profiled_env(tree: Path, work: Path, name: str) -> tuple[dict[str, str], Path]:
    """The environment of a job run from ``tree`` whose driver process is profiled
    (:data:`PROFILE` as its ``sitecustomize``), and the folder its profile lands in."""
    hook = work / f"hook-{name}"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PROFILE)
    profile = work / f"profile-{name}"
    profile.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": f"{hook}:{tree}", "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0", "RAYORCH_BENCH_PROFILE_DIR": str(profile)}
    return env, profile


def local_run(tree: Path, corpus: Path, work: Path, name: str) -> dict[str, Any]:
    """The same job, local disk to local disk: documents/s, pools, and how busy the
    driver's main thread was (its CPU time over its life)."""
    env, profile = profiled_env(tree, work, f"local-{name}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text", "--input",
         str(corpus), "--output", str(work / f"out-local-{name}"), "--json", "--no-progress"],
        env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: rayorch run pdf (local) failed: {err[-2000:]}")
    summary = json.loads(out)
    driver = json.loads((profile / f"{proc.pid}.json").read_text())
    return {"documents": summary["documents"], "run_s": summary["run_s"],
            "wall_s": summary["wall_s"],
            "docs_per_s": round(summary["documents"] / summary["run_s"], 2),
            **_driver_busy(driver), "pools": summary.get("pools"),
            "bound_by": summary.get("bound_by")}


def _driver_busy(driver: dict[str, Any]) -> dict[str, Any]:
    """Where the driver's time went: its main thread's CPU, all its threads' CPU, over its
    life (Ray's workers are other processes)."""
    life = driver["life_s"]
    return {"driver_life_s": round(life, 2),
            "driver_main_cpu": round(driver.get("main_cpu_s", 0.0) / life, 3),
            "driver_process_cpu": round(driver.get("process_cpu_s", 0.0) / life, 3)}


def io_run(tree: Path, endpoint: str, bucket: str, docs: int, input_bytes: int,
           inputs: set[str], work: Path, name: str) -> dict[str, Any]:
    from rayorch.testing_s3 import FaultyProxy

    env, profile = profiled_env(tree, work, name)
    with FaultyProxy(endpoint) as proxy:
        env["AWS_ENDPOINT_URL"] = proxy.endpoint
        proc = subprocess.Popen(
            [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text", "--input",
             f"s3://{bucket}/in", "--output", f"s3://{bucket}/out-{name}", "--json",
             "--no-progress"], env=env, cwd=work, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: rayorch run pdf failed: {err[-2000:]}")
        requests = sum(proxy.requests.values())
        by_method = dict(proxy.requests)
        downloaded = sum(proxy.bytes_out[p] for p in inputs)
        input_gets = sum(proxy.by_path[("GET", p)] for p in inputs)
        input_heads = sum(proxy.by_path[("HEAD", p)] for p in inputs)
    summary = json.loads(out)
    driver = json.loads((profile / f"{proc.pid}.json").read_text())
    return {
        "documents": summary["documents"], "succeeded": summary["succeeded"],
        "run_s": summary["run_s"], "wall_s": summary["wall_s"],
        "docs_per_s": round(summary["documents"] / summary["run_s"], 2),
        "downloaded_over_input": round(downloaded / input_bytes, 3),
        "input_gets_per_doc": round(input_gets / docs, 2),
        "input_heads_per_doc": round(input_heads / docs, 2),
        "requests_per_doc": round(requests / docs, 2), "requests": by_method,
        "driver_blocked_s": round(driver["blocked_s"], 2),
        "driver_life_s": round(driver["life_s"], 2),
        "driver_blocked": round(driver["blocked_s"] / driver["life_s"], 3),
        **_driver_busy(driver),
        "driver_calls": {k: {"calls": c, "s": round(s, 2)}
                         for k, (c, s) in sorted(driver["by_what"].items())},
        "pools": summary.get("pools"), "bound_by": summary.get("bound_by"),
    }


def io_bench(trees: list[tuple[str, Path]], docs: int, local: bool = False) -> dict[str, Any]:
    import boto3

    from bench.object_storage import start_s3
    from rayorch.testing import one_page_pdf

    endpoint, server = start_s3()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    bodies = {f"in/doc{i:05d}.pdf": one_page_pdf(i) for i in range(docs)}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: client.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]),
                      bodies.items()))
    inputs = {f"/{bucket}/{key}" for key in bodies}
    input_bytes = sum(map(len, bodies.values()))
    result: dict[str, Any] = {"docs": docs, "input_bytes": input_bytes, "trees": {}}
    try:
        with tempfile.TemporaryDirectory(prefix="rayorch-bench-io-") as tmp:
            for name, tree in trees:
                print(f"driver_io: {name} ({tree}) ...", file=sys.stderr, flush=True)
                result["trees"][name] = io_run(tree, endpoint, bucket, docs, input_bytes,
                                               inputs, Path(tmp), name)
            if local:
                corpus = Path(tmp) / "corpus"
                corpus.mkdir()
                for key, body in bodies.items():
                    (corpus / Path(key).name).write_bytes(body)
                for name, tree in trees:
                    print(f"driver_io: {name} local ...", file=sys.stderr, flush=True)
                    result.setdefault("local", {})[name] = local_run(tree, corpus, Path(tmp),
                                                                    name)
    finally:
        if server is not None:
            server.terminate()
    if len(trees) == 2:
        (a, _), (b, _) = trees
        first, second = result["trees"][a], result["trees"][b]
        result[f"{b}_over_{a}"] = {
            key: round(second[key] / first[key], 3) if first[key] else None
            for key in ("docs_per_s", "downloaded_over_input", "requests_per_doc",
                        "driver_blocked")}
    return result


# -- memory ------------------------------------------------------------------------------------
def make_documents(paths: list[str]) -> list[dict[str, Any]]:
    """A rendered one-page document per name, as ``AssembleDocument`` gives it."""
    return [{"path": p, "title": p, "pages": 1, "sha256": "0" * 64,
             "markdown": f"# {p}\n\n" + "word " * 300, "page_engines": ["text"],
             "empty_pages": [], "no_layer_pages": [], "garbage_pages": []} for p in paths]


def memory_child(store: str, docs: int, first: int) -> dict[str, Any]:
    """In the driver process: heap growth per delivered document from ``first`` to ``docs``
    of a job-like run (the job's ``OutputDir`` sink and ``PDF_WRITER``)."""
    import gc
    import tracemalloc

    import rayorch as ro
    from rayorch.driver import new_run_id
    from rayorch.pipelines.job.layouts import PDF_JOB
    from rayorch.pipelines.job.output import OutputDir
    from rayorch.pipelines.job.pdf_outputs import PDF_WRITER
    from rayorch.pipelines.job.summary import JobSummary

    class TinyDocs(ro.Pipeline):
        def __init__(self) -> None:
            super().__init__()
            self.render = ro.RayModule(make_documents, batch_size=64, num_cpus=0.5)

        def forward(self, paths: ro.Port) -> Any:
            return self.render(paths)

    out_dir = tempfile.mkdtemp(prefix="rayorch-bench-mem-")
    sources = [f"doc{i:06d}.pdf" for i in range(docs)]
    out = OutputDir.prepare(out_dir, job=PDF_JOB, sources=sources, options={})
    pipeline = TinyDocs()
    sink = out.sink_for(new_run_id(pipeline.compile()), PDF_WRITER)
    summary = JobSummary(PDF_JOB, total=docs)
    handle = pipeline.run(sources, store=store, ordered=False, quiet=True, progress=False,
                          sink=sink)
    last = docs - first  # both marks in the steady state (the first and last sources
    marks: dict[int, tuple[int, float]] = {}  # held active are not in the difference)
    snaps: list[Any] = []
    tracemalloc.start()
    for count, (index, value) in enumerate(handle, 1):
        PDF_WRITER.delivered(summary, sources[index], value)
        del value
        if count in (first, last):
            gc.collect()
            marks[count] = (tracemalloc.get_traced_memory()[0], time.perf_counter())
            snaps.append(tracemalloc.take_snapshot())
    tracemalloc.stop()
    out.finish(True)
    top = snaps[1].compare_to(snaps[0], "lineno")[:6]
    grown = marks[last][0] - marks[first][0]
    return {"store": store.split("://")[0], "docs": docs, "from": first, "to": last,
            "bytes_per_doc": round(grown / (last - first), 1),
            "docs_per_s_traced": round((last - first) / (marks[last][1] - marks[first][1]), 1),
            "top_growth": [str(s) for s in top]}


def memory_bench(trees: list[tuple[str, Path]], docs: int) -> dict[str, Any]:
    from rayorch.testing import RedisServer

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rayorch-bench-redis-") as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        try:
            for name, tree in trees:
                for store in ("memory://", redis.url):
                    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
                    env |= {"PYTHONPATH": str(tree), "RAY_AUTH_MODE": "disabled",
                            "RAY_USAGE_STATS_ENABLED": "0"}
                    print(f"driver_io: memory {name} {store} ...", file=sys.stderr, flush=True)
                    proc = subprocess.run(
                        [sys.executable, str(Path(__file__).resolve()), "--memory-child",
                         store, "--memory", str(docs)],
                        env=env, cwd=tree, capture_output=True, text=True, timeout=3600,
                        check=False)
                    if proc.returncode != 0:
                        raise SystemExit(f"memory {name}: {proc.stderr[-3000:]}")
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                    result.setdefault(name, {})[row["store"]] = row
        finally:
            redis.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=300, help="one-page PDFs in the bucket")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="a checkout to run (repeatable; default: this one)")
    parser.add_argument("--memory", type=int, default=0, metavar="N",
                        help="also the memory run over N documents (0: none)")
    parser.add_argument("--no-io", action="store_true", help="the memory run only")
    parser.add_argument("--local", action="store_true",
                        help="also the same corpus local disk -> local disk")
    parser.add_argument("--json", default=str(REPO / "bench" / "out" / "driver_io.json"))
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:  # in the driver process of one memory run (memory_bench)
        print(json.dumps(memory_child(args.memory_child, args.memory, 1000)))
        return
    trees = [(t.partition("=")[0], Path(t.partition("=")[2]).resolve()) for t in args.tree] \
        or [("this", REPO)]
    result: dict[str, Any] = {}
    if not args.no_io:
        result["io"] = io_bench(trees, args.docs, args.local)
    if args.memory:
        result["memory"] = memory_bench(trees, args.memory)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
