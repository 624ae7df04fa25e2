"""Object storage: the PDF text path reading from and writing to an S3 server on loopback
against local disk, listing throughput, and requests per 1,000 pages.

    python -m bench.object_storage [--copies 4] [--objects 5000]

Starts its own ``moto_server`` on a free port (``$RAYORCH_TEST_S3`` uses a running one) and
puts a counting proxy (:mod:`rayorch.testing_s3`) between rayorch and it. The same corpus
(``examples/pdfs`` x ``--copies``) runs through ``rayorch run pdf`` twice, one after the
other: local directory to local directory, then ``s3://`` to ``s3://``. Each run's pages/s
after start-up comes from its own ``--json`` summary; the lower bound is the local run. JSON
to ``bench/out/object_storage.json``.
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
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "pdfs"


def start_s3() -> tuple[str, subprocess.Popen[bytes] | None]:
    given = os.environ.get("RAYORCH_TEST_S3")
    if given:
        return given, None
    from rayorch.testing import free_port

    port = free_port()
    proc = subprocess.Popen([shutil.which("moto_server") or "moto_server", "-H", "127.0.0.1",
                             "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    return endpoint, proc


def run_job(argv: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "rayorch.cli", "run", "pdf", *argv, "--json",
                           "--no-progress"], env=env, cwd=cwd, capture_output=True, text=True,
                          check=False, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"rayorch run pdf failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=4, help="copies of examples/pdfs")
    parser.add_argument("--objects", type=int, default=5000, help="objects for the listing")
    args = parser.parse_args()

    import boto3

    from rayorch.pipelines.sources import list_inputs
    from rayorch.testing_s3 import FaultyProxy

    endpoint, server = start_s3()
    creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
             "AWS_REGION": "us-east-1"}
    os.environ.update(creds, AWS_ENDPOINT_URL=endpoint)
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    work = Path(tempfile.mkdtemp(prefix="rayorch-bench-s3-"))
    result: dict[str, Any] = {"copies": args.copies, "objects": args.objects}
    try:
        local_in = work / "in"
        local_in.mkdir()
        for copy in range(args.copies):
            for pdf in sorted(EXAMPLES.glob("*.pdf")):
                shutil.copyfile(pdf, local_in / f"{copy}-{pdf.name}")
                client.put_object(Bucket=bucket, Key=f"in/{copy}-{pdf.name}",
                                  Body=pdf.read_bytes())
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
                   PYTHONPATH=str(REPO))
        local = run_job(["--input", str(local_in), "--output", str(work / "out")], env, work)
        with FaultyProxy(endpoint) as proxy:
            remote = run_job(["--input", f"s3://{bucket}/in", "--output", f"s3://{bucket}/out"],
                             {**env, "AWS_ENDPOINT_URL": proxy.endpoint}, work)
            requests = dict(proxy.requests)
        pages = int(remote["pages"])
        result["local"] = {k: local.get(k) for k in ("pages", "pages_per_s", "wall_s")}
        result["s3"] = {k: remote.get(k) for k in ("pages", "pages_per_s", "wall_s")}
        result["s3_over_local"] = round(remote["pages_per_s"] / local["pages_per_s"], 3)
        result["requests"] = requests
        result["documents"] = remote["documents"]
        result["requests_per_1000_pages"] = {
            k: round(v * 1000 / pages, 1) for k, v in requests.items()}
        result["requests_per_document"] = round(sum(requests.values()) / remote["documents"], 2)

        # listing: --objects keys under one prefix, listed as the job lists its input
        def put(i: int) -> None:
            client.put_object(Bucket=bucket, Key=f"many/{i:08d}.pdf", Body=b"%PDF-1.4\n")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, range(args.objects)))
        t0 = time.perf_counter()
        pages_seen = found = 0
        for page in list_inputs(f"s3://{bucket}/many", {".pdf"}, "PDF"):
            pages_seen += 1
            found += len(page)
        listing_s = time.perf_counter() - t0
        assert found == args.objects, (found, args.objects)
        result["listing"] = {"objects": found, "pages": pages_seen, "seconds": round(listing_s, 3),
                             "objects_per_s": round(found / listing_s)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if server is not None:
            server.terminate()
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "object_storage.json").write_text(json.dumps(result, indent=1))
    print(f"local disk: {result['local']['pages_per_s']} pages/s after start-up "
          f"({result['local']['pages']} pages); S3 on loopback: {result['s3']['pages_per_s']} "
          f"pages/s: {result['s3_over_local']:.2f}x the local run (the lower bound)")
    print(f"requests: {requests} = {result['requests_per_document']} per document; per "
          f"1,000 pages: {result['requests_per_1000_pages']}")
    print(f"listing: {found} objects in {listing_s:.2f} s ({result['listing']['objects_per_s']} "
          f"objects/s, {pages_seen} pages)")


if __name__ == "__main__":
    main()
