"""``rayorch run pdf --ocr vllm`` and ``rayorch run video --annotate vllm`` with a real vLLM
engine (the test VLM, vLLM's CPU build), each on the Redis store and then audited.

Each page and each clip gets one output, in order, made by the ``vllm`` engine; the
scanned (image-only) page too. With random weights the texts are noise, so the checks
are about where each output went, not what it says.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rayorch.cli import main as cli_main

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]

pymupdf: Any = pytest.importorskip("pymupdf")

REPO = Path(__file__).resolve().parents[2]
PDFS = REPO / "examples" / "pdfs"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_job(job: str, inputs: Path, out: Path, engine: str, model: Path, store: str,
            capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``rayorch run JOB ENGINE vllm --model MODEL`` on the store: its ``--json`` summary."""
    capsys.readouterr()
    code = cli_main(["run", job, "--input", str(inputs), "--output", str(out), engine, "vllm",
                     "--model", str(model), "--batch-size", "2", "--no-progress", "--json",
                     "--store", store])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    summary: dict[str, Any] = json.loads(captured.out)
    return summary


def test_run_pdf_with_the_vllm_engine_gives_every_page_in_order(
    ray_local: None, test_models: dict[str, Path], redis_url: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], audited: Callable[[str, str], bool],
) -> None:
    from rayorch.testing import write_scanned_pdf

    inputs = tmp_path / "pdfs"
    inputs.mkdir()
    shutil.copyfile(PDFS / "poemscol-cheatsheet.pdf", inputs / "a-poems.pdf")
    write_scanned_pdf(PDFS / "qtree-qarrows.pdf", inputs / "b-scanned.pdf")
    shutil.copyfile(PDFS / "qtree-qarrows.pdf", inputs / "c-qtree.pdf")
    pages = {}
    for pdf in sorted(inputs.iterdir()):
        with pymupdf.open(pdf) as doc:
            pages[str(pdf)] = len(doc)
    out = tmp_path / "out"
    summary = run_job("pdf", inputs, out, "--ocr", test_models["vlm"], redis_url, capsys)
    assert summary["pages"] == sum(pages.values()) and summary["failed"] == 0
    assert summary["page_engines"] == {"vllm": sum(pages.values())}
    rows = read_jsonl(out / "documents.jsonl")
    assert [r["source"] for r in rows] == sorted(pages)  # input order
    for row in rows:
        n = pages[row["source"]]
        assert row["status"] == "ok" and row["pages"] == n
        assert row["page_engines"] == ["vllm"] * n
        markdown = (out / row["markdown"]).read_text()
        marks = [line for line in markdown.splitlines() if line.startswith("<!-- page ")]
        assert marks == [f"<!-- page {p} engine=vllm -->" for p in range(1, n + 1)]
    assert audited(summary["run_id"], redis_url)


def test_run_video_with_the_vllm_captioner_gives_every_clip_in_time_order(
    ray_local: None, test_models: dict[str, Path], redis_url: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], audited: Callable[[str, str], bool],
) -> None:
    from rayorch.pipelines.video_synth import write_scenes_video

    inputs = tmp_path / "videos"
    inputs.mkdir()
    cuts = {str(inputs / "a.mp4"): write_scenes_video(inputs / "a.mp4", [1.0, 1.5, 1.0],
                                                      fps=8, size=(64, 48)),
            str(inputs / "b.mp4"): write_scenes_video(inputs / "b.mp4", [1.5], fps=8,
                                                      size=(64, 48))}
    out = tmp_path / "out"
    summary = run_job("video", inputs, out, "--annotate", test_models["vlm"], redis_url,
                      capsys)
    clips = read_jsonl(out / "clips.jsonl")
    assert summary["clips"] == len(clips) == sum(len(c) + 1 for c in cuts.values())
    videos = read_jsonl(out / "videos.jsonl")
    assert [v["source"] for v in videos] == sorted(cuts)
    for video in videos:
        mine = [c for c in clips if c["video"] == video["source"]]
        assert video["status"] == "ok" and video["clips"] == len(mine)
        assert [c["clip"] for c in mine] == list(range(len(mine)))
        assert all(a["end_s"] == b["start_s"] for a, b in itertools.pairwise(mine))
        for clip in mine:
            note = clip["annotation"]
            assert note["engine"] == "vllm" and note["model"] == str(test_models["vlm"])
            assert isinstance(note["caption"], str)
    assert audited(summary["run_id"], redis_url)
