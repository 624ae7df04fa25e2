"""The video job's decoding pieces on generated videos with known cuts (no Ray).

Cuts must land within 0.5 s of the true scene changes, long scenes must be split, every
bad input kind must fail alone with a one-line cause, and the clip signals must follow
what is in the frames.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rayorch as ro
from rayorch.pipelines.pdf import failure_kind

av: Any = pytest.importorskip("av")  # the [video] extra
pytest.importorskip("scenedetect")

from rayorch.pipelines.video_decode import (  # noqa: E402
    copy_clip,
    detect_cuts,
    keyframe_positions,
    laplacian_variance,
    plan_clips,
    probe_video,
    read_clip,
)
from rayorch.pipelines.video_synth import write_bad_videos, write_scenes_video  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "videos"
CUT_TOLERANCE_S = 0.5


def cuts_of(path: Path) -> tuple[list[float], float]:
    return detect_cuts(probe_video(str(path)))


@pytest.mark.parametrize(
    ("name", "durations", "codec", "fps"),
    [
        ("uneven.mp4", [2.0, 1.5, 3.0, 0.8, 2.2], "libx264", 12),
        ("vp9.webm", [1.0, 2.5, 1.5], "libvpx-vp9", 10),
        ("mpeg4.mkv", [3.0, 1.0, 2.0, 1.0], "mpeg4", 15),
    ],
)
def test_cuts_within_half_a_second_of_the_true_scene_changes(
    tmp_path: Path, name: str, durations: list[float], codec: str, fps: int
) -> None:
    path = tmp_path / name
    truth = write_scenes_video(path, durations, fps=fps, codec=codec)
    cuts, end = cuts_of(path)
    assert len(cuts) == len(truth), (cuts, truth)
    assert all(abs(c - t) <= CUT_TOLERANCE_S for c, t in zip(cuts, truth)), (cuts, truth)
    assert abs(end - sum(durations)) <= 1.0 / fps + 1e-6


def test_shipped_sample_cuts() -> None:
    cuts, end = cuts_of(EXAMPLES / "scenes.mp4")
    assert cuts == pytest.approx([2.0, 3.5], abs=CUT_TOLERANCE_S)
    assert end == pytest.approx(6.0, abs=0.11)
    real_cuts, real_end = cuts_of(EXAMPLES / "realshort.mp4")
    assert real_cuts == [] and real_end == pytest.approx(1.2, abs=0.05)


def test_long_scene_is_split_into_equal_parts_no_longer_than_the_cap() -> None:
    assert plan_clips([2.0], 0.0, 25.0, max_clip_s=10.0) == [
        (0.0, 2.0), (2.0, 9.666667), (9.666667, 17.333333), (17.333333, 25.0)]
    assert plan_clips([], 0.0, 2.5, max_clip_s=1.0, fps=10.0) == [
        (0.0, 0.8), (0.8, 1.7), (1.7, 2.5)]  # split points on frame times
    with pytest.raises(ValueError, match="max_clip_s"):
        plan_clips([], 0.0, 1.0, max_clip_s=0)


@given(
    cuts=st.lists(st.floats(0.01, 99.99), max_size=12, unique=True).map(sorted),
    max_clip=st.floats(0.5, 30.0),
    min_clip=st.floats(0.0, 2.0),
)
def test_clips_tile_the_video_in_order_and_respect_the_cap(
    cuts: list[float], max_clip: float, min_clip: float
) -> None:
    clips = plan_clips(cuts, 0.0, 100.0, max_clip_s=max_clip, min_clip_s=min_clip)
    assert clips[0][0] == 0.0 and clips[-1][1] == 100.0
    assert all(a < b <= a + max_clip + 1e-5 for a, b in clips)
    assert all(prev[1] == nxt[0] for prev, nxt in itertools.pairwise(clips))
    boundaries = {a for a, _ in clips}
    kept = [c for c in cuts if c - 0.0 >= min_clip and 100.0 - c >= min_clip]
    if min_clip == 0.0:
        assert all(round(c, 6) in boundaries for c in kept)


def test_keyframe_positions_names_fractions_and_errors() -> None:
    assert keyframe_positions("first,middle,last") == [0.0, 0.5, 1.0]
    assert keyframe_positions(["last", 0.25, "first"]) == [0.0, 0.25, 1.0]
    for bad in ("2", "middel", ""):
        with pytest.raises(ValueError):
            keyframe_positions(bad)


def test_bad_inputs_fail_with_their_kind_on_one_line(tmp_path: Path) -> None:
    kinds = write_bad_videos(tmp_path / "bad", EXAMPLES / "scenes.mp4")
    truncated_webm = tmp_path / "bad" / "truncated.webm"
    write_scenes_video(tmp_path / "whole.webm", [2.0, 2.0, 2.0], codec="libvpx-vp9")
    data = (tmp_path / "whole.webm").read_bytes()
    truncated_webm.write_bytes(data[: len(data) // 3])
    kinds["truncated.webm"] = "truncated"
    kinds["missing.mp4"] = "missing"
    for name, kind in kinds.items():
        path = str(tmp_path / "bad" / name)
        with pytest.raises(ro.RecordFailure) as caught:
            detect_cuts(probe_video(path))
        cause = caught.value.cause
        assert failure_kind(cause) == kind, cause
        assert "\n" not in cause and path in cause


def test_read_clip_keyframes_and_signals(tmp_path: Path) -> None:
    path = tmp_path / "two.mp4"
    write_scenes_video(path, [2.0, 3.0], fps=10, size=(96, 64))
    clip = {"video": str(path), "start_s": 2.0, "end_s": 5.0, "fps": 10.0}
    got = read_clip(clip, positions=[0.0, 0.5, 1.0], images=True, image_side=64)
    assert got["frames"] == 30
    assert [k["t"] for k in got["keyframes"]] == pytest.approx([2.0, 3.45, 4.9], abs=0.051)
    assert all(k["jpeg"].startswith(b"\xff\xd8") for k in got["keyframes"])
    assert got["signals"]["motion"] > 0.5  # the square and stripes move
    assert 20 < got["signals"]["brightness"] < 235
    no_images = read_clip(clip, positions=[0.5], images=False)
    assert [set(k) for k in no_images["keyframes"]] == [{"t"}]


def test_sharpness_is_lower_for_a_blurred_frame() -> None:
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(3)
    sharp = rng.integers(0, 256, size=(64, 96)).astype(np.uint8)
    blurred = ((sharp[:-2, :-2].astype(float) + sharp[1:-1, 1:-1] + sharp[2:, 2:]) / 3).astype(
        np.uint8)
    assert laplacian_variance(blurred) < laplacian_variance(sharp) / 2
    assert laplacian_variance(np.full((32, 32), 90, np.uint8)) == 0.0


def test_copy_clip_stream_copies_one_scene(tmp_path: Path) -> None:
    clip = {"video": str(EXAMPLES / "scenes.mp4"), "start_s": 2.0, "end_s": 3.5, "fps": 10.0}
    target = tmp_path / "clip.mp4"
    copy_clip(clip, target)
    with av.open(str(target)) as copied:
        assert {s.type for s in copied.streams} == {"video", "audio"}
        frames = sum(1 for _ in copied.decode(video=0))
    assert 15 <= frames <= 15 + 20  # from the keyframe at or before 2.0 s up to 3.5 s


def test_every_clip_of_a_webm_decodes_all_its_frames(tmp_path: Path) -> None:
    # Matroska seeks can land after the keyframe a clip needs; each clip must still
    # decode exactly its own frames.
    path = tmp_path / "scenes.webm"
    truth = write_scenes_video(path, [1.5, 4.0, 1.0, 3.5], fps=10, codec="libvpx-vp9")
    cuts, end = cuts_of(path)
    clips = plan_clips(cuts, 0.0, end, max_clip_s=2.0, fps=10.0)
    assert len(cuts) == len(truth)
    for start, stop in clips:
        got = read_clip({"video": str(path), "start_s": start, "end_s": stop, "fps": 10.0},
                        positions=[0.0, 1.0], images=False)
        assert got["frames"] == round((stop - start) * 10), (start, stop, got["frames"])
        assert got["keyframes"][0]["t"] == pytest.approx(start, abs=0.051)
