"""Generated videos with known scene cuts (PyAV), and the bad inputs the video job refuses.

A scene is a flat colour field with a drifting stripe pattern and a moving square, so
frames inside a scene differ a little (motion) and frames across a cut differ a lot.
Cut times are exact frame boundaries: scene ``k`` starts at ``sum(durations[:k])``.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "three.mp4"
>>> write_scenes_video(path, [1.0, 1.0, 1.0], fps=10, size=(64, 48))
[1.0, 2.0]
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np


def _scene_frame(scene: int, t: float, width: int, height: int) -> np.ndarray:
    """RGB frame of scene ``scene`` at ``t`` seconds into it (deterministic)."""
    # Golden-ratio hues (neighbouring scenes look different), away from red: a red field's
    # hue wraps around 0 under compression noise, which reads as a cut to HSV detectors.
    hue = 0.08 + 0.8 * ((scene * 0.381966) % 1.0)
    value = 0.45 + 0.4 * ((scene * 7) % 3) / 2
    base = np.array(colorsys.hsv_to_rgb(hue, 0.85, value)) * 255.0
    accent = 255.0 - base  # the complement: a different colour and grey level
    ys, xs = np.mgrid[0:height, 0:width]
    period = 6 + 3 * (scene % 4)
    angle = (scene % 3) * math.pi / 3
    phase = xs * math.cos(angle) + ys * math.sin(angle) + 8.0 * t
    stripes = ((phase // period) % 2).astype(np.float32)[..., None]
    frame = base * (1.0 - 0.4 * stripes)  # darker stripes: texture in the grey level too
    side = max(4, min(width, height) // 4)
    x = int((width - side) * (0.5 + 0.45 * math.sin(1.3 * t + scene)))
    y = int((height - side) * (0.5 + 0.45 * math.cos(0.9 * t + scene)))
    frame[y : y + side, x : x + side] = accent
    pixels: np.ndarray = np.clip(frame, 0, 255).astype(np.uint8)
    return pixels


def write_scenes_video(
    path: str | Path,
    durations: Sequence[float],
    *,
    fps: int = 12,
    size: tuple[int, int] = (96, 64),
    codec: str = "libx264",
    audio: bool = False,
) -> list[float]:
    """Write a video whose scenes last ``durations`` seconds; return its cut times.

    Durations are rounded to whole frames. ``codec`` is any PyAV encoder (``libx264``
    for ``.mp4``/``.mkv``, ``libvpx-vp9`` for ``.webm``, ``mpeg4`` ...). ``audio`` adds
    a quiet AAC (or Opus for WebM) tone track of the same length.
    """
    import av

    width, height = size
    frames_per_scene = [max(1, round(d * fps)) for d in durations]
    with av.open(str(path), mode="w") as container:
        stream: Any = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if codec == "libx264":
            stream.options = {"preset": "ultrafast", "crf": "28", "g": str(2 * fps)}
        audio_stream: Any = None
        if audio:
            audio_codec = "libopus" if str(path).endswith(".webm") else "aac"
            audio_stream = container.add_stream(audio_codec, rate=48000)
            audio_stream.bit_rate = 24_000
        for scene, count in enumerate(frames_per_scene):
            for i in range(count):
                frame = av.VideoFrame.from_ndarray(_scene_frame(scene, i / fps, width, height),
                                                   format="rgb24")
                container.mux(stream.encode(frame))
        container.mux(stream.encode())
        if audio_stream is not None:
            _write_tone(container, audio_stream, sum(frames_per_scene) / fps)
    cuts, at = [], 0
    for count in frames_per_scene[:-1]:
        at += count
        cuts.append(round(at / fps, 6))
    return cuts


def _write_tone(container: Any, stream: Any, seconds: float, rate: int = 48000) -> None:
    import av

    samples = int(seconds * rate)
    chunk = 960
    for start in range(0, samples, chunk):
        n = min(chunk, samples - start)
        t = (np.arange(start, start + n) / rate).astype(np.float32)
        wave = (0.05 * np.sin(2 * math.pi * 440.0 * t)).astype(np.float32)[None, :]
        frame = av.AudioFrame.from_ndarray(wave, format="fltp", layout="mono")
        frame.sample_rate = rate
        frame.pts = start
        frame.time_base = Fraction(1, rate)
        container.mux(stream.encode(frame))
    container.mux(stream.encode())


def write_audio_only(path: str | Path, seconds: float = 1.0) -> None:
    """An AAC tone in an ``.m4a``/``.mp4`` container (or Opus in ``.webm``/``.ogg``)."""
    import av

    codec = "libopus" if Path(path).suffix in (".webm", ".ogg", ".opus") else "aac"
    with av.open(str(path), mode="w") as container:
        _write_tone(container, container.add_stream(codec, rate=48000), seconds)


def write_zero_length(path: str | Path, size: tuple[int, int] = (64, 48)) -> None:
    """A valid AVI with one video stream and no frames at all (zero seconds)."""
    import av

    with av.open(str(path), mode="w", format="avi") as container:
        stream: Any = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        container.start_encoding()


def write_huge(path: str | Path, size: tuple[int, int] = (8000, 5000)) -> None:
    """One flat frame at a resolution over the job's default cap (40 MP > 36 MP)."""
    import av

    with av.open(str(path), mode="w") as container:
        stream: Any = container.add_stream("mpeg4", rate=1)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        frame = av.VideoFrame(size[0], size[1], "yuv420p")
        for plane in frame.planes:
            plane.update(bytes(plane.buffer_size))
        container.mux(stream.encode(frame))
        container.mux(stream.encode())


def write_bad_videos(target: str | Path, good: str | Path) -> dict[str, str]:
    """Every bad input kind the job refuses, made from ``good`` (an MP4); name -> kind."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    data = Path(good).read_bytes()
    (target / "zero-byte.mp4").write_bytes(b"")
    (target / "truncated.mp4").write_bytes(data[: len(data) // 2])
    (target / "notes.mp4").write_bytes(b"this is plain text, not a video\n" * 40)
    write_audio_only(target / "audio-only.mp4")
    write_zero_length(target / "zero-length.avi")
    write_huge(target / "huge.mkv")
    return {"zero-byte.mp4": "empty", "truncated.mp4": "truncated", "notes.mp4": "not a video",
            "audio-only.mp4": "audio only", "zero-length.avi": "no frames",
            "huge.mkv": "resolution"}
