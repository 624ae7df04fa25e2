"""``rayorch run video`` from the loopback S3 server to it, as the PDF job runs.

Protects: the video job reads its inputs from the bucket (the actors read the objects by
ranged reads) and writes its clip files there, each clip an object named in ``clips.jsonl``;
the clips and rows are those of the same run on local disk; a bad object fails alone; nothing
lands on local disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from s3_tools import keys

pytestmark = [pytest.mark.s3, pytest.mark.timeout(900)]

pytest.importorskip("av")
pytest.importorskip("scenedetect")
pytest.importorskip("obstore")

REPO = Path(__file__).resolve().parents[2]
VIDEOS = REPO / "examples" / "videos"


def run(argv: list[str], cwd: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-m", "rayorch.cli", "run", "video", *argv,
                           "--write-clips", "--json", "--no-progress", "--allow-failures"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_video_job_reads_from_and_writes_clips_to_the_bucket(
        s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3")
    local_in = tmp_path / "in"
    local_in.mkdir()
    (local_in / "scenes.mp4").write_bytes((VIDEOS / "scenes.mp4").read_bytes())
    (local_in / "zero.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 40)  # no video
    for path in sorted(local_in.iterdir()):
        client.put_object(Bucket=bucket, Key=f"vids/{path.name}", Body=path.read_bytes())
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    remote = run(["--input", f"s3://{bucket}/vids", "--output", f"s3://{bucket}/out"], cwd)
    local = run(["--input", str(local_in), "--output", str(tmp_path / "out")], tmp_path)
    assert (remote["videos"], remote["succeeded"], remote["failed"]) == (2, 1, 1)
    assert remote["clips"] == local["clips"] > 1

    def lines(text: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in text.splitlines()]

    clips = lines(client.get_object(Bucket=bucket, Key="out/clips.jsonl")["Body"].read().decode())
    local_clips = lines((tmp_path / "out" / "clips.jsonl").read_text())
    assert [c["video"] for c in clips] == [f"s3://{bucket}/vids/scenes.mp4"] * len(clips)
    spans = ("clip", "start_s", "end_s")
    assert [[c[k] for k in spans] for c in clips] == [[c[k] for k in spans] for c in local_clips]
    stored = set(keys(s3_endpoint, bucket, "out/"))
    for clip in clips:  # each clip file an object under --output, the size of the local one
        assert f"out/{clip['file']}" in stored
        size = client.head_object(Bucket=bucket, Key=f"out/{clip['file']}")["ContentLength"]
        assert size > 0
    rows = lines(client.get_object(Bucket=bucket, Key="out/videos.jsonl")["Body"].read().decode())
    assert [(r["source"].rpartition("/")[2], r["status"]) for r in rows] == [
        ("scenes.mp4", "ok"), ("zero.mp4", "failed")]
    assert list(cwd.iterdir()) == []  # nothing of the run on local disk
