"""Time to first dispatch over a prefix of many small objects on an S3 server on loopback:
today's whole listing before admission against the streamed listing (issue 38 item 3).

    python -m bench.listing_first_output [--objects 10000] [--job] [--baseline-repo DIR]

Puts ``--objects`` one-page PDFs under one prefix (``moto_server`` on a free port, or
``$RAYORCH_TEST_S3``). Input side, in this process, one after the other on the same bucket:

* today: the job's old admission path, the whole listing as a dict, sorted, largest first
  (``dict(list_pdfs(...))``), until the first source could be admitted;
* after: :class:`~rayorch.pipelines.inputs.InputStream` until it hands out its first source.

With ``--job``: ``rayorch run pdf --ocr text`` from the prefix to the bucket, timed from the
process start to the first ``.md`` in the output, then killed; with ``--baseline-repo DIR``
the same run of the rayorch checked out in DIR (e.g. main) first. JSON to
``bench/out/listing_first_output.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def one_page_pdf() -> bytes:
    import pymupdf

    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "one page")
    data = doc.tobytes()
    doc.close()
    return bytes(data)


def first_output(repo: Path, url: str, out: str, env: dict[str, str]) -> float:
    """Seconds from the start of ``rayorch run pdf`` (of ``repo``) to its first ``.md``."""
    import boto3

    bucket, _, prefix = out.removeprefix("s3://").partition("/")
    client = boto3.client("s3")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rayorch.cli", "run", "pdf", "--ocr", "text",
                             "--input", url, "--output", out, "--no-progress"],
                            env={**env, "PYTHONPATH": str(repo)}, cwd=repo,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        while True:
            listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
            if any(o["Key"].endswith(".md") for o in listed.get("Contents", [])):
                return round(time.perf_counter() - t0, 2)
            if proc.poll() is not None:
                raise SystemExit(f"the job ended first: {proc.stderr.read()[-2000:]!r}"
                                 if proc.stderr else "the job ended first")
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10_000)
    parser.add_argument("--job", action="store_true")
    parser.add_argument("--baseline-repo", type=Path, default=None)
    args = parser.parse_args()

    import boto3

    from bench.object_storage import start_s3
    from rayorch.pipelines.inputs import InputSpec, InputStream
    from rayorch.pipelines.pdf import list_pdfs

    endpoint, proc = start_s3()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
            "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    os.environ.update(env)
    result: dict[str, Any] = {"objects": args.objects}
    try:
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        client = boto3.client("s3")
        client.create_bucket(Bucket=bucket)
        body = one_page_pdf()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: client.put_object(Bucket=bucket, Key=f"in/{i:08d}.pdf",
                                                      Body=body), range(args.objects)))
        url = f"s3://{bucket}/in"

        t0 = time.perf_counter()
        sizes = {item.name: item.size for item in list_pdfs(url)}  # today: the whole listing
        order = sorted(sorted(sizes), key=lambda name: sizes[name], reverse=True)
        today = time.perf_counter() - t0
        assert len(order) == args.objects
        t0 = time.perf_counter()
        stream = InputStream(InputSpec(url, (".pdf",), "PDF"))
        first = next(iter(stream))
        after = time.perf_counter() - t0
        stream.close()
        assert first[0] < stream.spec.window
        result["first_dispatch_s"] = {"today": round(today, 3), "after": round(after, 3),
                                      "today_over_after": round(today / after, 1)}
        if args.job:
            jobs: dict[str, float] = {}
            if args.baseline_repo is not None:
                jobs["today"] = first_output(args.baseline_repo.resolve(), url,
                                             f"s3://{bucket}/out-today", env)
            jobs["after"] = first_output(REPO, url, f"s3://{bucket}/out-after", env)
            if "today" in jobs:
                jobs["today_over_after"] = round(jobs["today"] / jobs["after"], 2)
            result["first_md_s"] = jobs
    finally:
        if proc is not None:
            proc.terminate()
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "listing_first_output.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
