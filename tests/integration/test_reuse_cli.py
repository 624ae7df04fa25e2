"""``rayorch run pdf|video --reuse``: on real files, a re-run runs only what changed.

Ten PDFs (two of them scans, so there are OCR Grains), then the same ten and one new file
(10% more): only the new one is rendered and assembled. Then only an assemble option
changes (``--no-page-markers``): no render or OCR Grain runs, every document is assembled
again. On a real redis-server and on a named memory store that the test holds open (the
CLI runs in this process).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rayorch.cli import main
from rayorch.inspect.status import run_status
from rayorch.store.registry import open_store
from rayorch.testing import write_scanned_pdf

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
pytest.importorskip("pymupdf")
pytest.importorskip("rapidocr_onnxruntime")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pdfs"
VIDEOS = EXAMPLES.parent / "videos"


def corpus(tmp_path: Path) -> Path:
    pdfs = tmp_path / "pdfs"
    pdfs.mkdir()
    for pdf in sorted(EXAMPLES.glob("*.pdf")):
        shutil.copy(pdf, pdfs / pdf.name)
    write_scanned_pdf(EXAMPLES / "qtree-qarrows.pdf", pdfs / "scan-1.pdf")
    write_scanned_pdf(EXAMPLES / "phonrule-doc.pdf", pdfs / "scan-2.pdf")
    return pdfs


def run_pdf(pdfs: Path, out: Path, store: str, capsys: pytest.CaptureFixture[str],
            *extra: str) -> dict[str, Any]:
    code = main(["run", "pdf", "--input", str(pdfs), "--output", str(out), "--store", store,
                 "--render-replicas", "1", "--no-progress", "--json", *extra])
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == 0, result
    return result


def ran(store_url: str, run_id: str) -> dict[str, int]:
    """Grains dispatched per Call (Grains that ran; reused ones are not dispatched)."""
    with open_store(store_url) as store:
        return {call: c["dispatched"] for call, c in run_status(store, run_id).calls.items()}


def documents(out: Path) -> dict[str, str]:
    return {Path(p).name: p.read_text() for p in map(Path, sorted(out.rglob("*.md")))}


def test_a_memory_store_cannot_be_reused_from_the_cli(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A memory:// store ends with the process that made it: ``--reuse`` with one is a usage
    error before anything runs (no Ray, nothing written)."""
    code = main(["run", "pdf", "--input", str(EXAMPLES), "--output", str(tmp_path / "out"),
                 "--store", "memory://", "--reuse", "latest", "--no-progress"])
    assert code == 2
    assert "--reuse needs the store of the earlier run" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# On Redis only: the CLI refuses --reuse with a memory:// store (it ends with its process;
# test_a_memory_store_cannot_be_reused_from_the_cli); the memory store's reuse is in the
# default suite through tests/integration/test_reuse.py (one ro.Executor).
@pytest.mark.long
def test_rerun_renders_only_new_pdfs_and_an_assemble_change_runs_no_ocr(
        ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
        ) -> None:
    url = f"{redis_url}?keep=all"  # every value outlives its source: every stage reusable
    held = open_store(url)
    try:
        pdfs = corpus(tmp_path)
        first = run_pdf(pdfs, tmp_path / "a", url, capsys)
        counts = ran(url, first["run_id"])
        assert counts["render"] == 10 and counts["ocr"] >= 2 and counts["assemble"] == 10

        shutil.copy(EXAMPLES / "parallel.pdf", pdfs / "zz-new.pdf")
        second = run_pdf(pdfs, tmp_path / "b", url, capsys, "--reuse", "latest")
        assert ran(url, second["run_id"]) == {"render": 1, "ocr": 0, "assemble": 1}
        old, new = documents(tmp_path / "a"), documents(tmp_path / "b")
        assert set(new) - set(old) == {"00010-zz-new.md"}
        assert {name: new[name] for name in old} == old

        third = run_pdf(pdfs, tmp_path / "c", url, capsys, "--reuse", second["run_id"],
                        "--no-page-markers")
        assert ran(url, third["run_id"]) == {"render": 0, "ocr": 0, "assemble": 11}
        unmarked = documents(tmp_path / "c")
        assert set(unmarked) == set(new) and "<!-- page" not in "".join(unmarked.values())
    finally:
        held.close()


@pytest.mark.long
def test_video_rerun_decodes_and_annotates_only_new_and_changed_videos(
        ray_local: None, redis_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``rayorch run video --reuse latest``: the shipped samples again, one of them changed
    under its name, plus one new video: only those two are probed, cut, decoded and
    annotated (the file's bytes enter the key, not only its name); the unchanged one's clips
    are the same."""
    pytest.importorskip("av")
    pytest.importorskip("scenedetect")
    from rayorch.pipelines.video_synth import write_scenes_video

    url = f"{redis_url}?keep=all"  # every value outlives its source: every stage reusable
    videos = tmp_path / "videos"
    shutil.copytree(VIDEOS, videos, ignore=shutil.ignore_patterns("*.md"))

    def run_video(out: Path, *extra: str) -> dict[str, Any]:
        code = main(["run", "video", "--input", str(videos), "--output", str(out),
                     "--store", url, "--no-progress", "--json", *extra])
        result: dict[str, Any] = json.loads(capsys.readouterr().out)
        assert code == 0, result
        return result

    first = run_video(tmp_path / "a")
    assert first["clips"] == 4  # scenes.mp4: 3, realshort.mp4: 1
    counts = ran(url, first["run_id"])
    assert set(counts.values()) != {0}

    # One new video (2 scenes), and one changed under its old name (1 scene): both run.
    write_scenes_video(videos / "zz-new.mp4", [1.0, 1.5], fps=10, size=(80, 60),
                       codec="libx264")
    write_scenes_video(videos / "realshort.mp4", [2.0], fps=10, size=(80, 60),
                       codec="libx264")
    second = run_video(tmp_path / "b", "--reuse", "latest")
    assert second["clips"] == 6
    again = ran(url, second["run_id"])
    assert again["probe"] == 2 and again["assemble"] == 2, again
    assert again["annotate"] == 3 and again["decode"] == 3, again  # their clips only
    old = [r for r in jsonl(tmp_path / "a" / "clips.jsonl") if "scenes.mp4" in r["video"]]
    assert len(old) == 3
    new = jsonl(tmp_path / "b" / "clips.jsonl")
    assert [r for r in new if "scenes.mp4" in r["video"]] == old


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
