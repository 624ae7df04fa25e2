"""Output formats: what ``rayorch run pdf --format files|parquet|jsonl.zst|wds`` writes.

For each format, one real ``rayorch run pdf --ocr text`` subprocess over the same corpus
(copies of examples/pdfs), measuring from the outside:

* objects and bytes written per 1,000 documents (every file under ``--output``), and their
  ratio to ``files`` measured in the same run of this bench;
* documents/s (the job's own ``run_s``: Ray and pool start-up excluded);
* the spread of the part sizes (min / median / max, in units of ``--shard-size``);
* the time from the process start to the first readable part (a part file whose format
  decodes; for ``files``, the first ``.md``).

    python bench/output_formats.py --copies 4 --shard-size 256KB
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rayorch.core.sizes import format_byte_size, parse_byte_size  # noqa: E402
from rayorch.runtime.sinks import read_part  # noqa: E402
from rayorch.storage import open_storage  # noqa: E402
from rayorch.store.records.sink import PartName  # noqa: E402
from rayorch.testing_cli import cli_env  # noqa: E402

FORMATS = ("files", "parquet", "jsonl.zst", "wds")


def corpus(root: Path, copies: int) -> Path:
    inputs = root / "in"
    inputs.mkdir()
    for copy in range(copies):
        for pdf in sorted((REPO / "examples" / "pdfs").glob("*.pdf")):
            shutil.copyfile(pdf, inputs / f"{copy}-{pdf.name}")
    return inputs


def first_readable(out: Path, fmt: str, t0: float, stop: threading.Event,
                   found: dict[str, float]) -> None:
    """Poll ``out`` until a part (or, for files, a .md) is there and reads."""
    while not stop.is_set() and "first" not in found:
        if out.is_dir():
            names = sorted(p.name for p in out.iterdir())
            if fmt == "files":
                if any(n.endswith(".md") for n in names):
                    found["first"] = time.monotonic() - t0
            else:
                for name in names:
                    if PartName.parse(name) is not None:
                        try:
                            read_part(open_storage(out), name)
                        except Exception:  # not readable yet: poll again
                            continue
                        found["first"] = time.monotonic() - t0
                        break
        time.sleep(0.01)


def run(inputs: Path, out: Path, fmt: str, shard_size: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "rayorch.cli", "run", "pdf", "--input", str(inputs),
            "--output", str(out), "--ocr", "text", "--no-progress", "--json",
            "--format", fmt, "--shard-size", shard_size]
    found: dict[str, float] = {}
    stop = threading.Event()
    t0 = time.monotonic()
    poll = threading.Thread(target=first_readable, args=(out, fmt, t0, stop, found))
    poll.start()
    done = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    stop.set()
    poll.join()
    if done.returncode != 0:
        raise SystemExit(f"{fmt}: {done.stderr[-2000:]}")
    summary = json.loads(done.stdout)
    files = [p for p in out.rglob("*") if p.is_file()]
    parts = [p.stat().st_size for p in files if PartName.parse(p.name) is not None]
    return {"format": fmt, "documents": summary["documents"], "objects": len(files),
            "bytes": sum(p.stat().st_size for p in files), "run_s": summary["run_s"],
            "wall_s": wall, "first_s": found.get("first"), "parts": parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=4, help="copies of examples/pdfs")
    parser.add_argument("--shard-size", default="256KB")
    args = parser.parse_args()
    target = parse_byte_size(args.shard_size)
    with tempfile.TemporaryDirectory(prefix="rayorch-bench-formats-") as tmp:
        inputs = corpus(Path(tmp), args.copies)
        results = [run(inputs, Path(tmp) / fmt.replace(".", "-"), fmt, args.shard_size)
                   for fmt in FORMATS]
    base = results[0]
    print(f"corpus: {base['documents']} documents (examples/pdfs x{args.copies}), --ocr text, "
          f"--shard-size {args.shard_size}")
    print("| format | objects /1k docs | x files | bytes /1k docs | x files | docs/s | "
          "parts (min / median / max, x target) | first readable part (s from start) | "
          "run wall (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        per = 1000 / r["documents"]
        spread = "-" if r["format"] == "files" or not r["parts"] else (
            f"{len(r['parts'])}: {min(r['parts']) / target:.2f} / "
            f"{statistics.median(r['parts']) / target:.2f} / {max(r['parts']) / target:.2f}")
        first = "-" if r["first_s"] is None else f"{r['first_s']:.1f}"
        print(f"| {r['format']} | {r['objects'] * per:.0f} | "
              f"{r['objects'] / base['objects']:.2f} | "
              f"{format_byte_size(int(r['bytes'] * per))} | {r['bytes'] / base['bytes']:.2f} | "
              f"{r['documents'] / r['run_s']:.1f} | {spread} | {first} | {r['wall_s']:.1f} |")


if __name__ == "__main__":
    main()
