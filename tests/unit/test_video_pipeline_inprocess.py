"""VideoPipeline's plan evaluated in process (no Ray): generated and shipped videos, bad ones.

The reference interpreter and the kernel-driven executor (elastic batches across videos,
faults) must give what calling the modules directly gives; a bad video fails alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rayorch.core.outcome import Item, Outcome
from rayorch.core.plan import Policy
from rayorch.core.reference import evaluate
from rayorch.pipelines.pdf import failure_kind
from rayorch.runtime.in_process import ExecutorOptions, execute

pytest.importorskip("av")  # the [video] extra
pytest.importorskip("scenedetect")

from rayorch.pipelines.video import (
    AnnotateClip,
    AssembleVideo,
    DecodeClip,
    ProbeVideo,
    VideoPipeline,
    find_videos,
)
from rayorch.pipelines.video_synth import write_scenes_video

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "videos"
MAX_CLIP_S = 3.0


def expected_video(path: str) -> dict[str, Any]:
    clips, meta = ProbeVideo(max_clip_s=MAX_CLIP_S).probe(path)
    [video] = AssembleVideo()([AnnotateClip("stats")(DecodeClip()(clips))], [meta])
    return video


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("videos")
    write_scenes_video(root / "a-long.mp4", [1.0, 7.0, 2.0], fps=8, size=(64, 48))
    write_scenes_video(root / "b-short.mp4", [1.5, 1.0], fps=8, size=(64, 48))
    (root / "c-notes.mp4").write_text("not a video\n")
    return [*find_videos(root), *find_videos(EXAMPLES)]


def check(outputs: dict[int, tuple[Item, ...]], sources: list[str], *, origin: bool) -> None:
    assert sorted(outputs) == list(range(len(sources)))
    for index, path in enumerate(sources):
        [item] = outputs[index]
        if path.endswith("c-notes.mp4"):
            assert item.outcome is Outcome.SUPPRESSED and item.cause
            if origin:
                assert failure_kind(item.cause) == "not a video", item.cause
            continue
        assert item.outcome is Outcome.PRESENT, item
        assert item.value == expected_video(path)
        starts = [c["start_s"] for c in item.value["clips"]]
        assert starts == sorted(starts) and [c["clip"] for c in item.value["clips"]] == list(
            range(len(starts)))


def test_long_scene_split_and_clips_in_time_order(sources: list[str]) -> None:
    video = expected_video(sources[0])
    spans = [(c["start_s"], c["end_s"]) for c in video["clips"]]
    # scene 2 (7 s) is cut into three parts no longer than MAX_CLIP_S, on frame times
    assert spans == [(0.0, 1.0), (1.0, 3.375), (3.375, 5.625), (5.625, 8.0), (8.0, 10.0)]
    assert video["cuts"] == [1.0, 8.0]
    assert all(c["annotation"] == {"engine": "stats", "flags": []} for c in video["clips"])


def test_annotate_with_several_batches_in_flight_gives_the_same_videos(
        sources: list[str]) -> None:
    """``annotate_inflight=2``: AsyncAnnotateClip (its own event loop, the CPU engine in a
    thread); the videos are the same."""
    pipeline = VideoPipeline("stats", max_clip_s=MAX_CLIP_S, annotate_inflight=2)
    assert pipeline.annotate.options.max_inflight == 2
    check(evaluate(pipeline.compile(), [(p,) for p in sources]).outputs, sources, origin=False)


def test_reference_evaluation(sources: list[str]) -> None:
    plan = VideoPipeline("stats", max_clip_s=MAX_CLIP_S).compile()
    check(evaluate(plan, [(p,) for p in sources]).outputs, sources, origin=False)


@pytest.mark.parametrize(
    "options",
    [
        ExecutorOptions(batch_size=3, policy=Policy.ELASTIC, actors=2, seed=1, random_order=True),
        ExecutorOptions(batch_size=2, policy=Policy.PARENT_BOUND, seed=2, fault_rate=0.2),
    ],
    ids=["elastic-random-order", "parent-bound-with-faults"],
)
def test_executor_schedules_give_the_same_videos(
    sources: list[str], options: ExecutorOptions
) -> None:
    plan = VideoPipeline("stats", max_clip_s=MAX_CLIP_S).compile()
    check(execute(plan, [(p,) for p in sources], options).outputs, sources, origin=True)
