"""``rayorch run video`` end to end on real Ray: generated videos with known cuts, the shipped
samples, every bad-input kind, and real videos from Debian packages.

One Ray for the module (``ray_local``). The command must cut at the true scene changes
(within 0.5 s), write clips in per-video order, name each bad file with its one-line
cause, and follow the exit-code and output-directory rules.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rayorch.cli import main as cli_main
from rayorch.pipelines.job.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from rayorch.pipelines.sources import failure_kind
from rayorch.runtime.sinks import read_outputs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

pytest.importorskip("av")  # the [video] extra
pytest.importorskip("scenedetect")

from rayorch.pipelines.video_synth import write_bad_videos, write_scenes_video  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "videos"
VIDEO_CACHE = REPO / ".cache" / "videos"
CUT_TOLERANCE_S = 0.5
MAX_CLIP_S = 4.0
GOOD = {  # name -> scene durations (s); the 9 s scene is longer than MAX_CLIP_S
    "ads.mp4": [1.2, 2.0, 1.6, 0.9],
    "lecture.mkv": [2.5, 9.0, 1.5],
    "trailer.webm": [1.0, 1.0, 2.0, 1.0],
}


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[float]]]:
    """good/ (generated, known cuts), samples/ (shipped) and bad/ (every bad kind)."""
    root = tmp_path_factory.mktemp("video-inputs")
    truth: dict[str, list[float]] = {}
    (root / "good").mkdir()
    for name, durations in GOOD.items():
        codec = "libvpx-vp9" if name.endswith(".webm") else "libx264"
        path = root / "good" / name
        truth[str(path)] = write_scenes_video(path, durations, fps=10, size=(80, 60), codec=codec)
    shutil.copytree(EXAMPLES, root / "samples", ignore=shutil.ignore_patterns("*.md"))
    truth[str(root / "samples" / "scenes.mp4")] = [2.0, 3.5]
    truth[str(root / "samples" / "realshort.mp4")] = []
    return root, truth


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli_main(["run", "video", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_video_cuts_at_true_scene_changes_and_names_bad_files(
    ray_local: None, input_dir: tuple[Path, dict[str, list[float]]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], quick_pool_sizing: None,
) -> None:
    root, truth = input_dir
    bad = write_bad_videos(tmp_path / "bad", EXAMPLES / "scenes.mp4")
    shutil.copytree(tmp_path / "bad", root / "bad", dirs_exist_ok=True)
    out = tmp_path / "out"
    code, stdout, _ = run_cli(["--input", str(root), "--output", str(out), "--no-progress",
                               "--json", "--max-clip-s", str(MAX_CLIP_S), "--write-clips"],
                              capsys)
    assert code == EXIT_FAILED
    summary = json.loads(stdout)
    assert summary["videos"] == len(truth) + len(bad)
    assert summary["succeeded"] == len(truth) and summary["failed"] == len(bad)
    assert summary["failures"] == {kind: 1 for kind in sorted(bad.values())}
    # By default the job's stages size themselves, and the summary names the binding one.
    pools = summary["pools"]
    assert {name: pool["replicas"] for name, pool in pools.items()} == {
        "probe": "auto", "decode": "auto", "annotate": "auto", "assemble": "1"}
    assert summary["bound_by"] in pools, summary
    assert all(1 <= p["start"] <= p["most"] and 1 <= p["end"] <= p["most"] for p in pools.values())

    videos = read_jsonl(out / "videos.jsonl")
    sources = [v["source"] for v in videos]
    assert sources == sorted(sources)  # input order (sorted paths)
    for row in videos:
        name = Path(row["source"]).name
        if row["source"] in truth:
            assert row["status"] == "ok" and row["cause"] is None
            continue
        assert row["status"] == "failed" and failure_kind(row["cause"]) == bad[name]
        assert "\n" not in row["cause"] and row["source"] in row["cause"]
        listed = [f for f in summary["failed_files"] if f["source"] == row["source"]]
        assert listed == [{"source": row["source"], "cause": row["cause"]}]

    clips = read_jsonl(out / "clips.jsonl")
    order = [(sources.index(c["video"]), c["clip"]) for c in clips]
    assert order == sorted(order)  # per-video order, clips in time order
    for video, cuts in truth.items():
        mine = [c for c in clips if c["video"] == video]
        row = next(v for v in videos if v["source"] == video)
        assert [c["clip"] for c in mine] == list(range(row["clips"])) and mine
        assert all(a["end_s"] == b["start_s"] for a, b in itertools.pairwise(mine))
        assert all(c["end_s"] - c["start_s"] <= MAX_CLIP_S + 0.1 for c in mine)
        found = row["cuts"]
        assert len(found) == len(cuts), (video, found, cuts)
        assert all(abs(f - t) <= CUT_TOLERANCE_S for f, t in zip(found, cuts)), (found, cuts)
        starts = [c["start_s"] for c in mine]
        assert all(any(abs(s - f) < 1e-6 for s in starts) for f in found)  # cuts start clips
        for clip in mine:
            assert set(clip["signals"]) == {"motion", "brightness", "sharpness"}
            assert clip["annotation"]["engine"] == "stats" and len(clip["keyframes"]) == 3
            assert (out / clip["file"]).is_file()
    lecture = [c for c in clips if c["video"].endswith("lecture.mkv")]
    assert len(lecture) == 5  # 2.5 s | 9 s split in three | 1.5 s


def test_output_directory_rules_and_exit_codes(
    ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_scenes_video(inputs / "one.mp4", [1.0, 1.0], fps=8, size=(64, 48))
    (inputs / "broken.mp4").write_bytes(b"")
    out = tmp_path / "out"
    base = ["--input", str(inputs), "--output", str(out)]

    code, stdout, stderr = run_cli([*base, "--write-clips", "--allow-failures",
                                    "--progress-every", "0.2"], capsys)
    assert code == EXIT_OK  # one failed, but --allow-failures
    assert "rayorch: starting Ray..." in stderr
    assert ("rayorch: starting 4 pools (probe auto, decode auto, annotate auto, "
            "assemble x1)...") in stderr
    progress = [line for line in stderr.splitlines() if "/2 videos" in line]  # piped
    assert all("clips/s" in line and "failure" in line for line in progress)
    assert progress[-1].startswith("rayorch: 2/2 videos, 2 clips"), progress
    assert "2 videos (1 ok, 1 failed)" in stdout
    assert "\npools: probe auto (1" in stdout and ", assemble x1" in stdout
    assert f"{inputs / 'broken.mp4'}: probe[0] failed: empty:" in stdout
    assert (out / "clips").is_dir()

    code, _, stderr = run_cli(base, capsys)
    assert code == EXIT_USAGE and "holds an earlier run" in stderr
    assert "--overwrite" in stderr and "--resume" in stderr

    (inputs / "broken.mp4").unlink()
    (out / "notes.txt").write_text("mine")
    code, stdout, _ = run_cli([*base, "--overwrite"], capsys)
    assert code == EXIT_OK and "1 video (1 ok, 0 failed)" in stdout and "2 clips in" in stdout
    names = sorted(p.name for p in out.iterdir())  # no stale clips/, the user's file kept
    assert [n for n in names if not n.startswith("part-")] == [
        ".rayorch-output.json", "_rayorch_sink.json", "clips.jsonl", "notes.txt", "videos.jsonl"]
    assert [r["index"] for r in read_outputs(out)] == [0]  # the part files: this run's only

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    code, _, stderr = run_cli(["--input", str(inputs), "--output", str(foreign),
                               "--overwrite"], capsys)
    assert code == EXIT_USAGE and "holds no earlier rayorch run" in stderr
    assert (foreign / "notes.txt").read_text() == "mine"


def test_resume_keeps_finished_videos_and_reruns_the_rest(
    ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_scenes_video(inputs / "a.mp4", [1.0, 1.5], fps=8, size=(64, 48))
    (inputs / "b.mp4").write_bytes(b"")  # fails now; a good video by the resume
    out = tmp_path / "out"
    base = ["--input", str(inputs), "--output", str(out), "--no-progress", "--json",
            "--write-clips"]
    code, stdout, _ = run_cli(base, capsys)
    assert code == EXIT_FAILED and json.loads(stdout)["failed"] == 1
    a_clips = read_jsonl(out / "clips.jsonl")
    a_files = {c["file"]: (out / c["file"]).stat().st_mtime_ns for c in a_clips}
    assert len(a_files) == 2

    code, _, stderr = run_cli([*base, "--resume", "--max-clip-s", "3"], capsys)
    assert code == EXIT_USAGE and "the options changed" in stderr

    write_scenes_video(inputs / "b.mp4", [0.75, 1.0, 1.25], fps=8, size=(64, 48))
    code, stdout, _ = run_cli([*base, "--resume"], capsys)
    summary = json.loads(stdout)
    assert code == EXIT_OK, summary
    assert (summary["videos"], summary["kept"], summary["succeeded"], summary["failed"]) == (
        2, 1, 2, 0)
    assert summary["clips"] == 3  # only b ran: a was kept
    videos = read_jsonl(out / "videos.jsonl")
    assert [(v["id"], v["status"], v["clips"]) for v in videos] == [(0, "ok", 2), (1, "ok", 3)]
    clips = read_jsonl(out / "clips.jsonl")
    assert clips[:2] == a_clips  # a's lines kept as they were, first
    assert [(Path(c["video"]).name, c["clip"]) for c in clips[2:]] == [
        ("b.mp4", 0), ("b.mp4", 1), ("b.mp4", 2)]
    assert {f: (out / f).stat().st_mtime_ns for f in a_files} == a_files  # not written again
    on_disk = sorted(str(p.relative_to(out)) for p in (out / "clips").rglob("*") if p.is_file())
    assert on_disk == sorted(c["file"] for c in clips)

    code, stdout, _ = run_cli([*base, "--resume"], capsys)  # nothing left to do
    assert code == EXIT_OK and json.loads(stdout)["run_id"] is None


def test_all_failed_exits_1_and_says_no_clip_was_made(
    ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.mp4").write_text("plain text\n")
    (inputs / "b.webm").write_bytes(b"")
    code, stdout, _ = run_cli(["--input", str(inputs), "--output", str(tmp_path / "out"),
                               "--no-progress", "--replicas", "2", "--decode-replicas", "1-3"],
                              capsys)
    assert code == EXIT_FAILED
    # A number given is that many actors (a range, that range): the summary says so.
    assert "\npools: probe auto (1" in stdout
    assert ", decode 1-3 (1" in stdout and ", annotate x2, assemble x1" in stdout
    assert "2 videos (0 ok, 2 failed)" in stdout and "0 clips in" in stdout
    assert "not a video:" in stdout and "empty:" in stdout
    assert "clips.jsonl (empty: no clip was made)" in stdout


def test_redis_lineage_store_run_passes_audit(
    ray_local: None, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    code, stdout, _ = run_cli(["--input", str(EXAMPLES), "--output", str(tmp_path / "out"),
                               "--no-progress", "--json", "--store", redis_url], capsys)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["clips"] == 4  # scenes.mp4: 3, realshort.mp4: 1
    capsys.readouterr()
    assert cli_main(["audit", summary["run_id"], "--store", redis_url]) == 0
    assert f"run {summary['run_id']}: OK" in capsys.readouterr().out
    records = sorted(read_outputs(tmp_path / "out"), key=lambda r: r["index"])
    clips = read_jsonl(tmp_path / "out" / "clips.jsonl")
    assert [line for r in records for line in r["value"]["lines"]] == clips


@pytest.mark.long
def test_real_debian_videos_cut_and_decode_every_clip() -> None:
    """Real footage (python3-imageio, gnome-user-docs); the WebM's sparse cues make seeks
    land after the keyframe a clip needs, so every clip must still decode its frames."""
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_videos import video_paths

    from rayorch.pipelines.video import DecodeClip, ProbeVideo

    if not video_paths(VIDEO_CACHE):
        if shutil.which("apt-get") is None:
            pytest.skip("the Debian videos are not cached and apt-get is not available")
        fetch = subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_videos.py"),
                                "--cache-dir", str(VIDEO_CACHE)],
                               capture_output=True, text=True, timeout=600, check=False)
        assert fetch.returncode == 0, fetch.stderr[-500:]
    paths = {p.name: p for p in video_paths(VIDEO_CACHE)}
    expected_cuts = {"cockatoo.mp4": [7.85], "realshort.mp4": [],
                     "display-dual-monitors.webm": [1.0, 3.27, 4.0, 35.67]}
    for name, cuts in expected_cuts.items():
        clips, meta = ProbeVideo(max_clip_s=10.0).probe(str(paths[name]))
        assert meta["cuts"] == pytest.approx(cuts, abs=0.05), name
        for clip, decoded in zip(clips, DecodeClip()(clips)):
            assert isinstance(decoded, dict), decoded
            expected = (clip["end_s"] - clip["start_s"]) * meta["fps"]
            assert abs(decoded["frames"] - expected) <= 1.5, (name, clip, decoded["frames"])


def test_wds_shards_hold_a_sample_per_clip_read_by_webdataset_and_datasets(
    ray_local: None, input_dir: tuple[Path, dict[str, list[float]]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], quick_pool_sizing: None,
) -> None:
    """``--format wds``: each clip is one WebDataset sample (its json and its mp4), every
    video's clips in order; the folder loads with ``datasets`` (its card), one row per
    sample; rayorch reads one record per video back (docs/output-formats.md)."""
    webdataset = pytest.importorskip("webdataset")
    datasets = pytest.importorskip("datasets")
    root, _ = input_dir
    out = tmp_path / "wds"
    code, stdout, _ = run_cli(["--input", str(root / "good"), "--output", str(out),
                               "--no-progress", "--json", "--max-clip-s", str(MAX_CLIP_S),
                               "--write-clips", "--format", "wds", "--shard-size", "200KB"],
                              capsys)
    assert code == EXIT_OK, stdout
    tars = sorted(str(p) for p in out.glob("part-*.tar"))
    samples = list(webdataset.WebDataset(tars, shardshuffle=False))
    keys = [s["__key__"] for s in samples]
    assert all("_" in k for k in keys)  # every good video has clips: a sample per clip
    # the clip itself, in its source's container (GOOD holds .mp4, .mkv and .webm videos)
    for s in samples:
        [(ext, data)] = [(k, v) for k, v in s.items() if k in ("mp4", "mkv", "webm")]
        assert data[4:8] == b"ftyp" if ext == "mp4" else data[:4] == b"\x1aE\xdf\xa3"
        assert json.loads(s["json"])["clips"][0]["file"].endswith("." + ext)
    per_video: dict[str, list[int]] = {}
    for key in keys:
        video, _, clip = key.partition("_")
        per_video.setdefault(video, []).append(int(clip))
    assert len(per_video) == len(GOOD)
    assert all(clips == list(range(len(clips))) for clips in per_video.values())
    hf = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert hf.num_rows == len(samples)
    assert sorted(r["json"]["$entry"]["index"] for r in hf) == sorted(
        int(k.partition("_")[2]) for k in keys)
    records = list(read_outputs(out))
    assert len(records) == len(GOOD)
    assert sum(len(r["value"]["clips"]) for r in records) == len(samples)
