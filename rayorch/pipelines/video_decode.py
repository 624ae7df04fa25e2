"""Video decoding for the video job (PyAV): probe a file, find its scene cuts, read a clip.

* :func:`probe_video` opens a file and reads its duration, fps and streams; a file the
  job cannot use raises ``RecordFailure("<kind>: <detail>")`` (one line).
* :func:`detect_cuts` decodes the whole video once, scaled down by swscale to at most
  ``width`` pixels, and feeds PySceneDetect's ``ContentDetector`` (HSV change, flash
  filter); see docs/topics/PIPELINES.md, "Video pipeline", for why this pairing.
* :func:`plan_clips` turns cuts into clips no longer than ``max_clip_s`` (a long scene is
  split into equal parts).
* :func:`read_clip` decodes one clip: keyframes, motion, brightness and sharpness.

>>> plan_clips([4.0], 0.0, 10.0, max_clip_s=5.0)
[(0.0, 4.0), (4.0, 7.0), (7.0, 10.0)]
"""

from __future__ import annotations

import io
import itertools
import math
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from rayorch.core.errors import RayorchError
from rayorch.pipelines.input_files import check_file
from rayorch.pipelines.sources import refuse
from rayorch.storage import open_storage, parse_location

MAX_FRAME_PIXELS = 36_000_000
"""Frames above this many pixels are refused (8K UHD, 7680 x 4320 = 33.2 MP, passes)."""
DETECT_WIDTH = 256
"""Frames are scaled to this width for cut detection (PySceneDetect's auto-downscale target)."""
SIGNAL_WIDTH = 160
"""Frames are scaled to this width (grey) for the motion, brightness and sharpness signals."""

VideoInfo = dict[str, Any]
"""``{"path", "duration_s", "fps", "width", "height", "codec", "frames", "streams",
"start_s"}``: what :func:`probe_video` read."""

_MAGIC = ((4, b"ftyp", "MP4/MOV"), (0, b"\x1a\x45\xdf\xa3", "Matroska/WebM"),
          (0, b"OggS", "Ogg"), (0, b"RIFF", "AVI"), (0, b"FLV", "FLV"),
          (0, b"\x00\x00\x01\xba", "MPEG-PS"))


def _container_kind(head: bytes) -> str | None:
    for offset, magic, name in _MAGIC:
        if head[offset : offset + len(magic)] == magic:
            return name
    return None


def _mp4_is_cut_short(path: Path) -> bool:
    """Whether an MP4's top-level boxes run past the end of the file."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        at = 0
        while at + 8 <= size:
            fh.seek(at)
            header = fh.read(16)
            length = int.from_bytes(header[:4], "big")
            if length == 1 and len(header) >= 16:
                length = int.from_bytes(header[8:16], "big")
            elif length == 0:  # the box runs to the end of the file
                return False
            if length < 8:
                return False
            at += length
        return at > size


def media(name: str | Path) -> Any:
    """What ``av.open`` reads ``name`` from: a local path, or an object store URL as a
    seekable file of ranged reads (the actor reads the object; nothing lands on disk)."""
    if isinstance(name, Path) or parse_location(name).is_local:
        return str(name)
    from rayorch.pipelines.input_lists import open_input

    try:
        return open_input(name, what="video")
    except RayorchError as exc:
        raise refuse("unreadable", str(exc)) from None


def _open(path: Path | str, head: bytes) -> Any:
    import av

    try:
        return av.open(media(path), metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        kind = _container_kind(head)
        why = str(getattr(exc, "strerror", None) or exc)
        if kind is None:
            raise refuse("not a video", f"{path}: FFmpeg recognizes no media container in it "
                         f"({why})") from None
        cut_short = isinstance(path, Path) and kind == "MP4/MOV" and _mp4_is_cut_short(path)
        if cut_short or isinstance(exc, av.error.EOFError):
            raise refuse("truncated", f"{path}: the {kind} container ends early ({why})"
                         ) from None
        raise refuse("damaged", f"{path} looks like {kind} but FFmpeg cannot read it ({why})"
                     ) from None


def probe_video(source: Any, *, max_frame_pixels: int = MAX_FRAME_PIXELS) -> VideoInfo:
    """Duration, fps, size and streams of one video; ``RecordFailure`` for a bad file."""
    file = check_file(source, "video", 64)
    path, head = (file.path if file.path is not None else file.name), file.head
    with _open(path, head) as container:
        streams = [{"index": s.index, "type": s.type,
                    "codec": s.codec_context.name if s.codec_context is not None else None}
                   for s in container.streams]
        if not container.streams.video:
            audio = [s["codec"] for s in streams if s["type"] == "audio"]
            if audio:
                raise refuse("audio only", f"{path} has no video stream, only audio "
                             f"({', '.join(str(c) for c in audio)})")
            raise refuse("no video", f"{path} has no video stream "
                         f"(streams: {[s['type'] for s in streams] or 'none'})")
        stream = container.streams.video[0]
        width, height = int(stream.width or 0), int(stream.height or 0)
        if width * height > max_frame_pixels:
            raise refuse("resolution", f"{path} is {width} x {height} ({width * height / 1e6:.1f}"
                         f" MP a frame), over the {max_frame_pixels / 1e6:g} MP cap")
        if width <= 0 or height <= 0:
            raise refuse("no frames", f"{path} has a video stream of size {width} x {height}")
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else 0.0
        tb = float(stream.time_base) if stream.time_base else 0.0
        duration = 0.0
        if container.duration:
            duration = container.duration / 1_000_000
        elif stream.duration and tb:
            duration = stream.duration * tb
        if duration <= 0.0 and not stream.frames:
            raise refuse("no frames", f"{path} has a video stream with zero duration and "
                         "no frames")
        start = (stream.start_time or 0) * tb
        return {"path": str(path), "duration_s": round(duration, 6), "fps": round(fps, 6),
                "width": width, "height": height, "codec": stream.codec_context.name,
                "frames": int(stream.frames or 0), "streams": streams, "start_s": start}


def _scaled(reformatter: Any, frame: Any, width: int, fmt: str) -> np.ndarray:
    w = min(width, frame.width)
    h = max(2, round(frame.height * w / frame.width))
    array: np.ndarray = reformatter.reformat(frame, width=w, height=h, format=fmt).to_ndarray()
    return array


def detect_cuts(info: VideoInfo, *, threshold: float = 27.0, min_scene_s: float = 0.5,
                width: int = DETECT_WIDTH) -> tuple[list[float], float]:
    """Scene cut times (s from the video's start) and the video's decoded end time.

    Raises ``RecordFailure`` when no frame decodes ("no frames"), when decoding stops
    well before the declared duration ("truncated") or fails mid-stream ("damaged").
    """
    import av
    from av.video.reformatter import VideoReformatter
    from scenedetect import ContentDetector, FrameTimecode

    path = info["path"]
    fps = info["fps"] or 25.0
    detector = ContentDetector(threshold=threshold, min_scene_len=float(min_scene_s))
    reformatter = VideoReformatter()
    cuts: list[float] = []
    first: float | None = None
    last = 0.0
    decoded = 0
    with av.open(media(path), metadata_errors="ignore") as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                if frame.time is None:
                    continue
                t = float(frame.time)
                first = t if first is None else first
                last = t
                decoded += 1
                image = _scaled(reformatter, frame, width, "bgr24")
                for timecode in detector.process_frame(FrameTimecode(t - first, fps), image):
                    cuts.append(round(float(timecode.seconds), 6))
        except av.error.FFmpegError as exc:
            if decoded == 0:
                raise refuse("damaged", f"{path}: no frame decodes ({exc})") from None
            raise refuse("damaged", f"{path}: decoding failed after {last:.2f} s ({exc})"
                         ) from None
    if first is None:
        raise refuse("no frames", f"{path} has a video stream but no frame decodes")
    end = last - first + 1.0 / fps
    declared = float(info["duration_s"])
    if declared > 0 and end < 0.9 * declared - 0.5:
        raise refuse("truncated", f"{path}: frames stop at {end:.2f} s of the declared "
                     f"{declared:.2f} s")
    cuts = sorted({c for c in cuts if 0.0 < c < end})
    return cuts, round(end, 6)


def plan_clips(cuts: list[float], start: float, end: float, *, max_clip_s: float,
               min_clip_s: float = 0.0, fps: float | None = None) -> list[tuple[float, float]]:
    """Scenes between ``cuts``, each split into equal parts no longer than ``max_clip_s``.

    A scene shorter than ``min_clip_s`` is merged into the one before it (or after it,
    for the first scene). With ``fps``, split points fall on frame times (so each
    frame belongs to exactly one clip, and a part is at most one frame over the cap).
    """
    if max_clip_s <= 0:
        raise ValueError(f"max_clip_s must be positive, not {max_clip_s}")
    inner = sorted({round(c, 6) for c in cuts if start < c < end}
                   - {round(start, 6), round(end, 6)})
    edges = [start, *inner, end]
    scenes = [(a, b) for a, b in itertools.pairwise(edges) if b > a]
    merged: list[tuple[float, float]] = []
    for a, b in scenes:
        if merged and min(b - a, merged[-1][1] - merged[-1][0]) < min_clip_s:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    clips: list[tuple[float, float]] = []
    for a, b in merged:
        parts = max(1, math.ceil((b - a) / max_clip_s - 1e-9))
        step = (b - a) / parts
        points = [a + i * step for i in range(1, parts)]
        if fps:
            points = [a + round((p - a) * fps) / fps for p in points]
        bounds = [a, *points, b]
        rounded = [round(x, 6) for x in bounds]
        clips += [(x, y) for x, y in itertools.pairwise(rounded) if y > x]
    return clips


KEYFRAME_POSITIONS = {"first": 0.0, "middle": 0.5, "last": 1.0}


def keyframe_positions(spec: str | list[Any] | tuple[Any, ...]) -> list[float]:
    """``"first,middle,last"`` (names or fractions in [0, 1]) -> sorted fractions.

    >>> keyframe_positions("first,0.25,last")
    [0.0, 0.25, 1.0]
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    positions: set[float] = set()
    for item in items:
        text = str(item).strip().lower()
        if not text:
            continue
        if text in KEYFRAME_POSITIONS:
            positions.add(KEYFRAME_POSITIONS[text])
            continue
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"bad keyframe position {item!r}: use first, middle, last or a "
                             "fraction between 0 and 1")
        positions.add(value)
    if not positions:
        raise ValueError("no keyframe positions given")
    return sorted(positions)


def laplacian_variance(gray: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian: low for blurred frames, high for sharp ones."""
    g = gray.astype(np.float32)
    if g.shape[0] < 3 or g.shape[1] < 3:
        return 0.0
    lap = (g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4.0 * g[1:-1, 1:-1])
    return float(lap.var())


def _jpeg(frame: Any, max_side: int, quality: int) -> bytes:
    image = frame.to_image()
    image.thumbnail((max_side, max_side))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def _seek_keyframe(container: Any, stream: Any, t: float) -> None:
    """Seek so that the next packet is a keyframe at or before ``t`` seconds.

    Some demuxers (Matroska without dense cues) land on a later, non-key packet: then
    seek again from further back, doubling the margin.
    """
    if t <= 0 or not stream.time_base:
        return
    tb = float(stream.time_base)
    margin = 0.0
    while True:
        target = max(0.0, t - margin)
        container.seek(int(target / tb), stream=stream, backward=True, any_frame=False)
        if target == 0.0:
            return
        packet = next((p for p in container.demux(stream) if p.pts is not None), None)
        if packet is None or (packet.is_keyframe and float(packet.pts * packet.time_base) <= t):
            container.seek(int(target / tb), stream=stream, backward=True, any_frame=False)
            return
        margin = max(1.0, 2 * margin)


def _frames_after_seek(container: Any, stream: Any) -> Any:
    """Decoded frames with a time; packets that fail before the first good frame are skipped
    (after a seek some decoders, e.g. VP8 in WebM, reject the packets before a keyframe)."""
    import av

    started = False
    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.error.InvalidDataError:
            if started:
                raise
            continue
        for frame in frames:
            if frame.time is not None:
                started = True
                yield frame


def read_clip(clip: dict[str, Any], *, positions: list[float], images: bool,
              image_side: int = 448, jpeg_quality: int = 85) -> dict[str, Any]:
    """Decode clip ``[start_s, end_s)``: keyframes at ``positions`` and cheap signals.

    Returns ``{"frames", "signals": {"motion", "brightness", "sharpness"}, "keyframes":
    [{"t", "jpeg"?}]}``. ``motion`` is the mean absolute grey-level change between
    consecutive frames (0-255), ``brightness`` the keyframes' mean grey level (0-255),
    ``sharpness`` their mean Laplacian variance (higher = sharper), all measured at
    ``SIGNAL_WIDTH`` pixels wide. ``jpeg`` (at most ``image_side`` a side) is present only
    when ``images``.
    """
    import av
    from av.video.reformatter import VideoReformatter

    origin = float(clip.get("origin_s", 0.0))
    fps = float(clip.get("fps") or 25.0)
    start, end = float(clip["start_s"]), float(clip["end_s"])
    half = 0.5 / fps
    targets = [start + p * max(0.0, end - start - 1.0 / fps) for p in positions]
    best: list[tuple[float, Any]] = [(math.inf, None) for _ in targets]
    reformatter = VideoReformatter()
    diffs: list[float] = []
    previous: np.ndarray | None = None
    frames = 0
    with av.open(media(clip["video"]), metadata_errors="ignore") as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        _seek_keyframe(container, stream, origin + start)
        for frame in _frames_after_seek(container, stream):
            t = float(frame.time) - origin
            if t < start - half:
                continue
            if t >= end - half:
                break
            frames += 1
            gray = _scaled(reformatter, frame, SIGNAL_WIDTH, "gray")
            if previous is not None and previous.shape == gray.shape:
                diffs.append(float(np.abs(gray.astype(np.int16) - previous).mean()))
            previous = gray
            for i, target in enumerate(targets):
                if abs(t - target) < best[i][0]:
                    best[i] = (abs(t - target), (t, frame, gray))
    keyframes: list[dict[str, Any]] = []
    grays: list[np.ndarray] = []
    for _distance, chosen in best:
        if chosen is None:
            continue
        t, frame, gray = chosen
        grays.append(gray)
        keyframe: dict[str, Any] = {"t": round(t, 6)}
        if images:
            keyframe["jpeg"] = _jpeg(frame, image_side, jpeg_quality)
        keyframes.append(keyframe)
    signals = {
        "motion": round(float(np.mean(diffs)), 4) if diffs else 0.0,
        "brightness": round(float(np.mean([g.mean() for g in grays])), 3) if grays else 0.0,
        "sharpness": round(float(np.mean([laplacian_variance(g) for g in grays])), 3)
        if grays else 0.0,
    }
    return {"frames": frames, "signals": signals, "keyframes": keyframes}


def copy_clip(clip: dict[str, Any], target: str | Path) -> str:
    """Write clip ``[start_s, end_s)`` to ``target`` by stream copy (no re-encoding).

    The copy starts at the keyframe at or before ``start_s`` (an exact cut needs
    re-encoding); audio packets of the same span are copied too. Returns ``target``.
    """
    import av

    origin = float(clip.get("origin_s", 0.0))
    start, end = origin + float(clip["start_s"]), origin + float(clip["end_s"])
    location = parse_location(str(target))
    buffer = None if location.is_local else io.BytesIO()
    if buffer is None:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    suffix = PurePosixPath(str(target)).suffix.lower()
    with av.open(media(clip["video"]), metadata_errors="ignore") as source, \
            (av.open(str(target), mode="w") if buffer is None else
             av.open(buffer, mode="w", format=MUXERS.get(suffix, "matroska"))) as sink:
        video = source.streams.video[0]
        chosen = [video, *source.streams.audio[:1]]
        outputs = {s.index: sink.add_stream_from_template(s) for s in chosen}
        _seek_keyframe(source, video, start)
        started = False
        for packet in source.demux(chosen):
            if packet.dts is None or packet.pts is None or packet.time_base is None:
                continue
            t = float(packet.pts * packet.time_base)
            if packet.stream.type == "video":
                if not started and not packet.is_keyframe:
                    continue
                started = True
                if t >= end:
                    break
            elif not started or t >= end:
                continue
            packet.stream = outputs[packet.stream.index]
            sink.mux(packet)
    if buffer is not None:  # an object store: the clip is one PUT, whole or not at all
        open_storage(location.parent()).put(location.name(), buffer.getvalue())
    return str(target)


MUXERS = {".mp4": "mp4", ".m4v": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "webm",
          ".avi": "avi", ".ogv": "ogg", ".mpg": "mpeg", ".mpeg": "mpeg", ".ts": "mpegts"}
"""The muxer of a clip written to memory (an object store target) by its suffix."""
