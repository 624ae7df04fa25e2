"""The video pipeline: video -> scene clips -> per-clip keyframes, signals, annotation.

Four batched modules and the pipeline that wires them::

    clips, meta = probe(videos)            # ProbeVideo: open, check, cut into scene clips
    frames = decode(F.expand(clips))       # DecodeClip: one Grain per clip: keyframes, signals
    notes = annotate(frames)               # AnnotateClip: an engine, batched across videos
    videos = assemble(F.reduce(notes), meta)   # AssembleVideo: one record, clips in time order

Bad input (missing, empty, not a video, truncated, damaged, audio only, no frames,
huge resolution) becomes ``ro.RecordFailure("<kind>: <detail>")`` for that video only.
See docs/topics/PIPELINES.md, "Video pipeline".

>>> from rayorch.pipelines.video import ProbeVideo, DecodeClip, AnnotateClip, AssembleVideo
>>> [(clips, meta)] = ProbeVideo()(["examples/videos/scenes.mp4"])
>>> [round(c["start_s"], 2) for c in clips]
[0.0, 2.0, 3.5]
>>> notes = AnnotateClip("stats")(DecodeClip()(clips))
>>> [video] = AssembleVideo()([notes], [meta])
>>> len(video["clips"])
3
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import rayorch as ro
from rayorch import F
from rayorch.core.program import Replicas
from rayorch.pipelines.limits import NATIVE_MAX_RSS, max_rss_bytes
from rayorch.pipelines.sources import each_alone, find_files, refuse, slug
from rayorch.pipelines.video_annotate import (
    AnnotatorError,
    ClipAnnotator,
    ClipFrames,
    annotator_needs_image,
    get_annotator,
)
from rayorch.pipelines.video_decode import (
    DETECT_WIDTH,
    MAX_FRAME_PIXELS,
    copy_clip,
    detect_cuts,
    keyframe_positions,
    plan_clips,
    probe_video,
    read_clip,
)
from rayorch.pipelines.vllm_runtime import model_replicas, vllm_num_cpus, vllm_num_gpus

VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".ogv", ".mpg",
                            ".mpeg", ".ts", ".flv", ".wmv", ".3gp"})
DEFAULT_MAX_CLIP_S = 10.0
DEFAULT_MIN_CLIP_S = 0.5

ClipSpec = dict[str, Any]
"""``{"video", "clip", "start_s", "end_s", "fps", "origin_s"}`` (+ ``"file"`` target)."""
VideoMeta = dict[str, Any]
"""``{"path", "duration_s", "fps", "width", "height", "codec", "streams", "cuts"}``."""


def _one_by_one(items: list[Any], work: Any, what: str) -> list[Any]:
    """``work(item)`` per item; a ``RecordFailure`` or any exception fails that item only."""
    return each_alone(items, work, lambda item: f"{what} "
                      f"{item.get('video') if isinstance(item, dict) else item}")


class ProbeVideo:
    """Open each video, check it, and cut it into scene clips no longer than ``max_clip_s``.

    Batched: called with a list of paths, returns per path ``(clips, meta)`` (a module
    with ``num_outputs=2``) or a ``RecordFailure``. Cuts come from PySceneDetect's
    content detector (``threshold``, scenes of at least ``min_clip_s``) over frames
    scaled to ``detect_width``; ``clips_dir`` names a directory the clips are copied to.
    """

    def __init__(self, *, max_clip_s: float = DEFAULT_MAX_CLIP_S,
                 min_clip_s: float = DEFAULT_MIN_CLIP_S, threshold: float = 27.0,
                 detect_width: int = DETECT_WIDTH, max_frame_pixels: int = MAX_FRAME_PIXELS,
                 clips_dir: str | None = None) -> None:
        if max_clip_s <= 0 or min_clip_s < 0 or threshold <= 0 or detect_width < 16:
            raise ro.RayorchError(
                f"bad cut options: max_clip_s={max_clip_s} must be > 0, min_clip_s="
                f"{min_clip_s} >= 0, threshold={threshold} > 0, detect_width={detect_width} >= 16")
        self.max_clip_s, self.min_clip_s = max_clip_s, min_clip_s
        self.threshold, self.detect_width = threshold, detect_width
        self.max_frame_pixels = max_frame_pixels
        self.clips_dir = clips_dir

    def __call__(self, paths: list[Any]) -> list[tuple[list[ClipSpec], VideoMeta] | Any]:
        return _one_by_one(paths, self.probe, "probing")

    def probe(self, source: Any) -> tuple[list[ClipSpec], VideoMeta]:
        """One video's clips and metadata; raises ``RecordFailure`` for a bad file."""
        info = probe_video(source, max_frame_pixels=self.max_frame_pixels)
        cuts, end = detect_cuts(info, threshold=self.threshold, min_scene_s=self.min_clip_s,
                                width=self.detect_width)
        spans = plan_clips(cuts, 0.0, end, max_clip_s=self.max_clip_s,
                           min_clip_s=self.min_clip_s, fps=info["fps"] or None)
        suffix = Path(info["path"]).suffix.lower() or ".mkv"
        clips: list[ClipSpec] = []
        for index, (start, stop) in enumerate(spans):
            clip: ClipSpec = {"video": info["path"], "clip": index, "start_s": start,
                              "end_s": stop, "fps": info["fps"], "origin_s": info["start_s"]}
            if self.clips_dir is not None:
                digest = hashlib.sha1(info["path"].encode()).hexdigest()[:8]
                folder = f"{slug(Path(info['path']).stem)[:60]}-{digest}"
                clip["file"] = f"{self.clips_dir.rstrip('/')}/{folder}/{index:04d}{suffix}"
            clips.append(clip)
        meta: VideoMeta = {**{k: v for k, v in info.items() if k != "start_s"},
                           "duration_s": end, "cuts": cuts}
        return clips, meta


class DecodeClip:
    """Decode each clip: keyframes (``keyframes`` positions) and the cheap signals.

    ``images`` encodes the keyframes as JPEG (at most ``image_side`` a side) for engines
    that read pixels; a clip with a ``"file"`` target is also copied there (stream copy).
    """

    def __init__(self, *, keyframes: str | list[Any] = "first,middle,last",
                 images: bool = False, image_side: int = 448) -> None:
        try:
            self.positions = keyframe_positions(keyframes)
        except ValueError as exc:
            raise ro.RayorchError(str(exc)) from None
        self.images, self.image_side = images, image_side

    def __call__(self, clips: list[ClipSpec]) -> list[ClipFrames | Any]:
        return _one_by_one(clips, self.decode, "decoding a clip of")

    def decode(self, clip: ClipSpec) -> ClipFrames:
        frames = read_clip(clip, positions=self.positions, images=self.images,
                           image_side=self.image_side)
        if frames["frames"] == 0:
            raise refuse("no frames", f"clip {clip['clip']} of {clip['video']} "
                         f"({clip['start_s']:.2f}-{clip['end_s']:.2f} s) decodes no frame")
        record = {k: clip[k] for k in ("video", "clip", "start_s", "end_s")}
        if "file" in clip:
            try:
                record["file"] = copy_clip(clip, clip["file"])
            except Exception as exc:
                raise refuse("clip copy", f"clip {clip['clip']} of {clip['video']} cannot be "
                             f"stream-copied to {clip['file']}: {exc}") from None
        return {**record, **frames}


class AnnotateClip:
    """One annotation engine per actor (chosen by name), batched over clips of many videos.

    Returns per clip ``{"video", "clip", "start_s", "end_s", "frames", "signals",
    "keyframes": [seconds], "annotation"}`` (+ ``"file"``); keyframe images stay here.
    """

    def __init__(self, engine: str | ClipAnnotator = "stats", **engine_options: Any) -> None:
        if isinstance(engine, str):
            self.engine_name = engine
            self.engine = get_annotator(engine, **engine_options)
        else:
            self.engine_name = type(engine).__name__
            self.engine = engine

    def __call__(self, clips: list[ClipFrames]) -> list[dict[str, Any]]:
        return self._records(clips, self.engine.annotate(clips) if clips else [])

    def _records(self, clips: list[ClipFrames], notes: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
        if len(notes) != len(clips):
            raise AnnotatorError(f"annotation engine {self.engine_name!r} returned "
                                 f"{len(notes)} annotations for {len(clips)} clips")
        results = []
        for clip, note in zip(clips, notes):
            record = {k: v for k, v in clip.items() if k != "keyframes"}
            record["keyframes"] = [k["t"] for k in clip["keyframes"]]
            record["annotation"] = {"engine": self.engine_name, **note}
            results.append(record)
        return results


class AsyncAnnotateClip(AnnotateClip):
    """:class:`AnnotateClip` for a module with several batches in flight (``max_inflight``):
    an engine with ``annotate_async`` (vLLM: the batches share one engine) is awaited, any
    other runs in a thread, off the module's event loop."""

    async def __call__(self, clips: list[ClipFrames]) -> list[dict[str, Any]]:  # type: ignore[override]
        import asyncio

        if not clips:
            return []
        annotate_async = getattr(self.engine, "annotate_async", None)
        notes = (await annotate_async(clips) if annotate_async is not None
                 else await asyncio.to_thread(self.engine.annotate, clips))
        return self._records(clips, notes)


class AssembleVideo:
    """A video's annotated clips (in time order) plus its metadata -> one record."""

    def __call__(self, clip_lists: list[list[dict[str, Any]]], metas: list[VideoMeta]
                 ) -> list[dict[str, Any]]:
        return [{**meta, "clips": sorted(clips, key=lambda c: c["start_s"])}
                for clips, meta in zip(clip_lists, metas, strict=True)]


class VideoPipeline(ro.Pipeline):
    """Video -> scene clips -> keyframes + signals -> annotation -> one record per video.

    ``annotate`` is ``"stats"`` (signals only, CPU), ``"ocr"`` (RapidOCR on keyframes, CPU)
    or ``"vllm"`` (a captioning VLM served by vLLM, ``engine_options={"model": ...}``: one GPU
    per replica, none with vLLM's CPU build). ``annotate_inflight`` > 1 lets each annotate
    actor run that many batches at once (:class:`AsyncAnnotateClip`: a vLLM engine then
    batches the clips of all of them). Each
    result is the ``AssembleVideo`` dict of one video, or a failed result with its cause.

    The probe, decode and annotate pools size themselves by default (``"auto"``:
    docs/topics/POOL-SIZING.md, "Pools that size themselves"); ``annotate="vllm"`` holds an engine
    per actor: ``"auto"`` with GPUs, one actor on vLLM's CPU build
    (:func:`~rayorch.pipelines.vllm_runtime.model_replicas`). A number is that many actors.

    >>> plan = VideoPipeline("stats").compile()
    """

    def __init__(
        self,
        annotate: str = "stats",
        *,
        max_clip_s: float = DEFAULT_MAX_CLIP_S,
        min_clip_s: float = DEFAULT_MIN_CLIP_S,
        threshold: float = 27.0,
        keyframes: str = "first,middle,last",
        clips_dir: str | None = None,
        probe_replicas: Replicas = "auto",
        decode_replicas: Replicas = "auto",
        replicas: Replicas | None = None,
        batch_size: int = 8,
        engine_options: dict[str, Any] | None = None,
        annotate_num_cpus: float | None = None,
        annotate_num_gpus: float | None = None,
        annotate_inflight: int = 1,
        actor_max_rss: int | str | None = NATIVE_MAX_RSS,
    ) -> None:
        super().__init__()
        rss = max_rss_bytes(actor_max_rss)  # native-memory stages (pipelines/limits.py)
        ProbeVideo(max_clip_s=max_clip_s, min_clip_s=min_clip_s, threshold=threshold)
        DecodeClip(keyframes=keyframes)  # bad options fail here, not inside an actor
        vllm = annotate == "vllm"
        gpus = annotate_num_gpus if annotate_num_gpus is not None else (
            vllm_num_gpus() if vllm else 0.0)
        if replicas is None:
            replicas = model_replicas(gpus) if vllm else "auto"
        self.probe = ro.RayModule(
            ProbeVideo, max_clip_s=max_clip_s, min_clip_s=min_clip_s, threshold=threshold,
            clips_dir=clips_dir, num_outputs=2, batch_size=1, replicas=probe_replicas,
            num_cpus=0.5, max_rss=rss,
        )
        self.decode = ro.RayModule(
            DecodeClip, keyframes=keyframes, images=annotator_needs_image(annotate),
            batch_size=batch_size, replicas=decode_replicas, num_cpus=0.5, max_rss=rss,
        )
        self.annotate = ro.RayModule(
            AnnotateClip if annotate_inflight == 1 else AsyncAnnotateClip, annotate,
            max_inflight=annotate_inflight, batch_size=batch_size, replicas=replicas,
            num_cpus=annotate_num_cpus if annotate_num_cpus is not None
            else (1.0 if annotate == "ocr" else vllm_num_cpus(0.25) if vllm else 0.25),
            num_gpus=gpus,
            **(engine_options or {}),
        )
        self.assemble = ro.RayModule(AssembleVideo, batch_size=8, num_cpus=0.25)

    def forward(self, videos: Any) -> Any:
        clips, meta = self.probe(videos)
        frames = self.decode(F.expand(clips))
        return self.assemble(F.reduce(self.annotate(frames)), meta)


def find_videos(source: str | Path) -> list[str]:
    """The video paths under a directory (recursive, sorted, by suffix), or the file itself."""
    return find_files(source, VIDEO_SUFFIXES, "video")
