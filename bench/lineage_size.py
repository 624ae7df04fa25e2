"""What a PDF job leaves in the lineage store and the payload store, per page (issue 37).

Runs ``rayorch run pdf`` as an operator would, on a fresh redis-server of its own, with
``payload_dir`` in a temporary directory, then reads what stayed: Redis's ``INFO memory``
growth, the run's keys' ``MEMORY USAGE``, the fact streams' ``XLEN``, the payload bytes left
(per Call folder) against the bytes of the delivered outputs (the files in --output).

    python bench/lineage_size.py --ocr text --input examples/pdfs
    python bench/lineage_size.py --ocr layout --input DIR_OF_A_FEW_PAGES
    python bench/lineage_size.py ... --code /path/to/other/checkout   # the same, older code
    python bench/lineage_size.py ... --keep all                       # keep=all on the store URL
    python bench/lineage_size.py ... --archive   # --archive DIR: finished lineage leaves Redis
    python bench/lineage_size.py ... --archive --archive-every 50   # and every 50 facts a shard

With ``--archive``, Redis's ``used_memory`` is also sampled every 0.2 s while the job runs
with the bytes of the shard keys (with every page of these small inputs in flight at once,
their peak per page is the Redis cost of a page in flight), and the archive's bytes per
Grain are read after the run.

``--code`` runs the CLI of another checkout (its ``rayorch`` package directory's parent), to
measure the code before a change with the same script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from rayorch.runtime.sinks import read_outputs
from rayorch.testing import RedisServer

REPO = Path(__file__).resolve().parents[1]


def run_job(code: Path, url: str, args: argparse.Namespace, out: Path,
            archive: Path | None = None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONPATH=str(code), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    cmd = [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", str(args.input.resolve()),
           "--output", str(out), "--store", url, "--ocr", args.ocr, "--no-progress", "--json"]
    if archive is not None:
        cmd += ["--archive", str(archive)]
    done = subprocess.run(cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True,
                          text=True, timeout=args.timeout)
    if done.returncode not in (0, 1):
        sys.exit(f"rayorch run pdf failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def run_keys(client: redis.Redis, run_id: str) -> dict[str, int]:
    """Every key of the run with its MEMORY USAGE (exact: SAMPLES 0)."""
    found: dict[str, int] = {}
    for key in client.scan_iter(match=f"ro:{{{run_id}*", count=1000):
        name = key.decode()
        found[name] = int(client.memory_usage(key, samples=0) or 0)
    return found


def output_bytes(out: Path) -> int:
    """The bytes the job delivered: every file it wrote in --output (the documents' .md,
    content lists and figures, the sink's parts), its markers left out."""
    return sum(p.stat().st_size for p in out.rglob("*")
               if p.is_file() and not p.name.startswith(("_rayorch", ".rayorch")))


def payload_bytes(root: Path) -> Counter[str]:
    """Payload bytes per Call folder (owner marks left out)."""
    sizes: Counter[str] = Counter()
    for path in root.rglob("*"):
        if path.is_file() and not path.name.startswith("."):
            sizes[path.parent.name] += path.stat().st_size
    return sizes


class PeakSampler:
    """The peak, sampled every 0.2 s on a thread, of the bytes (``MEMORY USAGE``) of every
    shard key (``ro:{run:k}:...``: streams, Grain tables, payload counts; the run's meta,
    manifest and plan are a fixed cost per run, left out), and of ``used_memory`` over
    ``base``."""

    def __init__(self, url: str, base: int) -> None:
        self.client = redis.Redis.from_url(url)
        self.base = base
        self.peak = 0
        self.peak_used = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_used = max(self.peak_used,
                                 int(self.client.info("memory")["used_memory"]) - self.base)
            self.peak = max(self.peak, shard_key_bytes(self.client))

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def shard_key_bytes(client: redis.Redis) -> int:
    return sum(int(client.memory_usage(key, samples=0) or 0)
               for key in client.scan_iter(match="ro:{*:*}:*", count=1000))


def count_grains(url: str, run_id: str) -> int:
    """Grains the run sealed with outputs (commits and reuses), read through the store (the
    archive too)."""
    from rayorch.core.facts import GrainCommitted, GrainReused
    from rayorch.store.registry import open_store

    with open_store(url) as store:
        return sum(isinstance(s.fact, GrainCommitted | GrainReused)
                   for facts in store.read_run(run_id, payloads=False).values() for s in facts)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    code = Path(args.code).resolve() if args.code else REPO
    with tempfile.TemporaryDirectory(prefix="lineage-size-") as tmp:
        work = Path(tmp)
        (work / "redis").mkdir()
        server = RedisServer(work / "redis")
        server.start()
        try:
            client = redis.Redis.from_url(server.url)
            before = int(client.info("memory")["used_memory"])
            payloads = work / "payloads"
            url = f"{server.url}?payload_dir={payloads}"
            if args.keep:
                url += f"&keep={args.keep}"
            if args.archive_every:
                url += f"&archive_every={args.archive_every}"
            archive = work / "archive" if args.archive else None
            sampler = PeakSampler(server.url, before)
            started = time.monotonic()
            with sampler:
                result = run_job(code, url, args, work / "out", archive)
            elapsed = time.monotonic() - started
            after = int(client.info("memory")["used_memory"])
            run_id = str(result["run_id"])
            keys = run_keys(client, run_id)
            facts = sum(int(client.xlen(k)) for k in keys if ":facts:" in k)
            records = list(read_outputs(work / "out"))
            pages = sum(int(r["value"].get("pages", 0)) for r in records
                        if isinstance(r.get("value"), dict))
            delivered = output_bytes(work / "out")
            left = payload_bytes(payloads / run_id)
            archived = sum(p.stat().st_size for p in archive.rglob("*.facts")) if archive else 0
            grains = count_grains(server.url, run_id)
            shard_keys_after = shard_key_bytes(client)
        finally:
            server.stop()
    stream_bytes = sum(v for k, v in keys.items() if ":facts:" in k)
    return {
        "ocr": args.ocr, "code": str(code), "keep": args.keep or "(default)",
        "archive_every": args.archive_every,
        "documents": len(records), "pages": pages, "elapsed_s": round(elapsed, 1),
        "redis_growth_bytes": after - before, "run_key_bytes": sum(keys.values()),
        "fact_stream_bytes": stream_bytes, "facts": facts,
        "payload_bytes_left": sum(left.values()), "payload_left_by_call": dict(left),
        "delivered_output_bytes": delivered, "archive": bool(args.archive),
        "peak_shard_key_bytes": sampler.peak, "peak_growth_bytes": sampler.peak_used,
        "shard_key_bytes_after": shard_keys_after, "archive_bytes": archived, "grains": grains,
    }


def report(m: dict[str, Any]) -> str:
    pages = max(1, m["pages"])
    facts = max(1, m["facts"])
    lines = [
        f"--ocr {m['ocr']}: {m['documents']} documents, {m['pages']} pages, keep "
        f"{m['keep']}, {m['elapsed_s']} s (code: {m['code']})",
        f"  Redis growth per page      {m['redis_growth_bytes'] / pages / 1024:8.2f} KB",
        f"  run keys per page          {m['run_key_bytes'] / pages / 1024:8.2f} KB",
        f"  facts per page             {m['facts'] / pages:8.2f}",
        f"  bytes per fact (streams)   {m['fact_stream_bytes'] / facts:8.0f}",
        f"  payload bytes left / page  {m['payload_bytes_left'] / pages / 1024:8.2f} KB",
        f"  delivered output / page    {m['delivered_output_bytes'] / pages / 1024:8.2f} KB",
        f"  payload left / output      "
        f"{m['payload_bytes_left'] / max(1, m['delivered_output_bytes']):8.2f} x",
        f"  payload left by Call       {m['payload_left_by_call']}",
        f"  Grains                     {m['grains']}",
    ]
    if m["archive"]:
        lines += [
            f"  peak shard keys / page     {m['peak_shard_key_bytes'] / pages / 1024:8.2f} KB "
            "(every page in flight)",
            f"  peak Redis growth / page   {m['peak_growth_bytes'] / pages / 1024:8.2f} KB",
            f"  shard keys after / page    {m['shard_key_bytes_after'] / pages / 1024:8.2f} KB",
            f"  archive bytes per Grain    {m['archive_bytes'] / max(1, m['grains']):8.1f}",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ocr", default="text", help="the job's --ocr (text, layout, ...)")
    parser.add_argument("--input", type=Path, default=REPO / "examples" / "pdfs")
    parser.add_argument("--code", default=None, help="the checkout whose CLI runs the job")
    parser.add_argument("--keep", choices=("outputs", "all"), default=None,
                        help="keep= on the store URL (default: none given)")
    parser.add_argument("--archive", action="store_true",
                        help="run the job with --archive DIR (a temporary directory)")
    parser.add_argument("--archive-every", type=int, default=None, metavar="FACTS",
                        help="archive_every= on the store URL (with --archive)")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    figures = measure(args)
    print(json.dumps(figures) if args.json else report(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
