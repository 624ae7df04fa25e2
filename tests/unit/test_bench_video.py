"""bench/video.py's corpus (the paper's shape, cached) and its per-run figures."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("av")  # the [video] extra

from bench.video import describe, make_corpus


def test_corpus_has_many_short_and_a_few_long_videos_and_is_reused(tmp_path: Path) -> None:
    paths = make_corpus(tmp_path, short=4, long_s=[20.0])
    assert sorted(Path(p).name for p in paths) == [
        "long-0-20s.mp4", "short-000.mp4", "short-001.mp4", "short-002.mp4", "short-003.mp4"]
    stamp = {p: Path(p).stat().st_mtime_ns for p in paths}
    assert make_corpus(tmp_path, short=4, long_s=[20.0]) == paths
    assert {p: Path(p).stat().st_mtime_ns for p in paths} == stamp  # cached, not rewritten


def test_describe_separates_start_up_and_the_long_videos() -> None:
    arrivals = [("<start-up>", 10.0, 0), ("/c/short-001.mp4", 11.0, 2),
                ("/c/long-0-60s.mp4", 14.0, 12), ("/c/short-002.mp4", 12.0, 1)]
    got = describe(arrivals)
    assert got["videos"] == 3 and got["clips"] == 15
    assert got["e2e_s"] == 14.0 and got["first_s"] == 11.0 and got["short_done_s"] == 12.0
    assert got["long_done_s"] == {"long-0-60s": 14.0}
    assert got["startup_s"] == 10.0 and got["clips_per_s_after_startup"] == 3.8
