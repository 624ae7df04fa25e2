"""The video job on rayorch beside the same job on Ray Data, in one run (``bench/RESULTS.md``).

Corpus with the paper's shape: many short videos and a few long ones (generated with
known cuts, 96x64 at 12 fps so that decoding stays cheap on 2 cores). Both systems run
the same module code from ``rayorch.pipelines.video``:

* rayorch: ``VideoPipeline`` (probe/cut -> F.expand -> decode -> annotate -> F.reduce),
  results as videos complete (``ordered=False``);
* Ray Data: ``from_items`` (read) -> ``flat_map`` (probe and cut into clip rows) ->
  ``map_batches`` decode (tasks) -> ``map_batches`` annotate (actor pool) ->
  ``groupby(video).map_groups`` (clips sorted back into time order).

Annotation is the ``stats`` engine plus a modelled VLM call: each batch sleeps
``gpu_batch_ms + gpu_clip_ms * clips`` on one of ``gpus`` declared (virtual) GPUs.
Reported per system: wall time to the last video, clips/s, when the first video, the
median video, the last short video and each long video arrived (the long tail).

    python -m bench.video                      # ~2-4 minutes on 2 cores
    python -m bench.video --short 30 --long 60 120 --reps 1   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rayorch.pipelines.video_annotate import ClipFrames, StatsAnnotator

REPO_ROOT = Path(__file__).resolve().parents[1]
CORPUS = REPO_ROOT / ".cache" / "bench-video"
MAX_CLIP_S = 5.0


class ModelledVlm(StatsAnnotator):
    """The stats engine, then a sleep standing in for a batched VLM call on a GPU."""

    def __init__(self, *, gpu_batch_ms: float = 50.0, gpu_clip_ms: float = 100.0) -> None:
        super().__init__()
        self.gpu_batch_s, self.gpu_clip_s = gpu_batch_ms / 1000, gpu_clip_ms / 1000

    def annotate(self, clips: list[ClipFrames]) -> list[dict[str, Any]]:
        time.sleep(self.gpu_batch_s + self.gpu_clip_s * len(clips))
        return super().annotate(clips)


def make_corpus(root: Path, short: int, long_s: list[float], seed: int = 7) -> list[str]:
    """``short`` videos of 2-9 s (1-3 scenes) and one video per ``long_s`` length."""
    from rayorch.pipelines.video_synth import write_scenes_video

    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    specs: list[tuple[str, list[float]]] = []
    for i in range(short):
        specs.append((f"short-{i:03d}.mp4", [round(rng.uniform(1.0, 3.5), 1)
                                              for _ in range(rng.randint(1, 3))]))
    for i, length in enumerate(long_s):
        scenes, total = [], 0.0
        while total < length:
            scene = round(min(rng.uniform(2.0, 14.0), length - total), 1)
            scenes.append(max(scene, 0.5))
            total += scenes[-1]
        specs.append((f"long-{i}-{int(length)}s.mp4", scenes))
    paths = []
    for name, scenes in specs:
        path = root / name
        marker = path.with_suffix(".json")
        if not (path.exists() and marker.exists() and json.loads(marker.read_text()) == scenes):
            write_scenes_video(path, scenes, fps=12, size=(96, 64))
            marker.write_text(json.dumps(scenes))
        paths.append(str(path))
    order = list(range(len(paths)))
    rng.shuffle(order)  # long videos somewhere in the middle, not first or last
    return [paths[i] for i in order]


def run_rayorch(paths: list[str], args: argparse.Namespace) -> list[tuple[str, float, int]]:
    import rayorch as ro
    from rayorch.pipelines.video import AnnotateClip, VideoPipeline

    pipeline = VideoPipeline("stats", max_clip_s=MAX_CLIP_S, probe_replicas=2,
                             decode_replicas=2, batch_size=args.batch_size)
    pipeline.annotate = ro.RayModule(
        AnnotateClip, ModelledVlm(gpu_batch_ms=args.gpu_batch_ms, gpu_clip_ms=args.gpu_clip_ms),
        batch_size=args.batch_size, replicas=args.gpus, num_cpus=0.1, num_gpus=1,
    )
    arrivals = []
    t0 = time.perf_counter()
    handle = pipeline.run(paths, ordered=False, progress=False, quiet=True)
    arrivals.append(("<start-up>", time.perf_counter() - t0, 0))  # actor pools are up
    for index, value in handle:
        assert isinstance(value, dict), value
        arrivals.append((paths[index], time.perf_counter() - t0, len(value["clips"])))
    return arrivals


def run_raydata(paths: list[str], args: argparse.Namespace) -> list[tuple[str, float, int]]:
    import pandas as pd
    import ray

    from rayorch.pipelines.video import AnnotateClip, AssembleVideo, DecodeClip, ProbeVideo

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ctx.shuffle_strategy = ray.data.context.ShuffleStrategy("sort_shuffle_pull_based")
    probe = ProbeVideo(max_clip_s=MAX_CLIP_S)

    def clip_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
        clips, meta = probe.probe(row["path"])
        meta_json = json.dumps(meta)
        return [{"vid": row["vid"], "clip": c["clip"], "spec": json.dumps(c), "meta": meta_json}
                for c in clips]

    def decode(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        decoded = DecodeClip()([json.loads(s) for s in batch["spec"]])
        return {**batch, "frames": np.array([json.dumps(d) for d in decoded], dtype=object)}

    class Annotate:
        def __init__(self) -> None:
            self.module = AnnotateClip(ModelledVlm(gpu_batch_ms=args.gpu_batch_ms,
                                                   gpu_clip_ms=args.gpu_clip_ms))

        def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            notes = self.module([json.loads(f) for f in batch["frames"]])
            return {"vid": batch["vid"], "clip": batch["clip"], "meta": batch["meta"],
                    "note": np.array([json.dumps(n) for n in notes], dtype=object)}

    def assemble(group: pd.DataFrame) -> pd.DataFrame:
        group = group.sort_values("clip")
        [video] = AssembleVideo()([[json.loads(n) for n in group["note"]]],
                                  [json.loads(group["meta"].iloc[0])])
        return pd.DataFrame([{"vid": int(group["vid"].iloc[0]), "clips": len(video["clips"])}])

    t0 = time.perf_counter()
    ds = ray.data.from_items([{"vid": i, "path": p} for i, p in enumerate(paths)],
                             override_num_blocks=min(len(paths), 2 * args.cpus))
    ds = ds.flat_map(clip_rows, num_cpus=0.5)
    ds = ds.map_batches(decode, batch_size=args.batch_size, num_cpus=0.5)
    ds = ds.map_batches(Annotate, batch_size=args.batch_size,
                        compute=ray.data.ActorPoolStrategy(size=args.gpus), num_gpus=1,
                        num_cpus=0.1)
    ds = ds.groupby("vid", num_partitions=args.cpus).map_groups(assemble, batch_format="pandas",
                                                                 num_cpus=0.5)
    arrivals = []
    for row in ds.iter_rows():
        arrivals.append((paths[int(row["vid"])], time.perf_counter() - t0, int(row["clips"])))
    return arrivals


def compare_detectors(paths: list[str], reps: int = 3) -> list[dict[str, Any]]:
    """Median seconds (of ``reps``) to find the cuts of each video, two ways:
    PySceneDetect's own pipeline (OpenCV decode, auto-downscale) and this job's
    (PyAV decode with swscale downscaling to 256 px, PySceneDetect's ContentDetector)."""
    from scenedetect import ContentDetector, SceneManager, open_video

    from rayorch.pipelines.video_decode import detect_cuts, probe_video

    def scenedetect_opencv(path: str) -> list[float]:
        manager = SceneManager()
        manager.add_detector(ContentDetector(min_scene_len=0.5))
        manager.auto_downscale = True
        manager.detect_scenes(open_video(path, backend="opencv"))
        return [round(s[0].get_seconds(), 2) for s in manager.get_scene_list()][1:]

    def pyav_content(path: str) -> list[float]:
        return [round(c, 2) for c in detect_cuts(probe_video(path))[0]]

    rows = []
    for path in paths:
        row: dict[str, Any] = {"video": Path(path).name}
        for name, find in (("scenedetect_opencv", scenedetect_opencv),
                           ("pyav_contentdetector", pyav_content)):
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                cuts = find(path)
                times.append(time.perf_counter() - start)
            row[f"{name}_s"] = round(statistics.median(times), 3)
            row[f"{name}_cuts"] = cuts
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def describe(arrivals: list[tuple[str, float, int]]) -> dict[str, Any]:
    startup = [t for p, t, _ in arrivals if p == "<start-up>"]
    arrivals = [a for a in arrivals if a[0] != "<start-up>"]
    times = sorted(t for _, t, _ in arrivals)
    short = [t for p, t, _ in arrivals if "/short-" in p]
    long_ = {Path(p).stem: round(t, 2) for p, t, _ in arrivals if "/long-" in p}
    clips = sum(n for _, _, n in arrivals)
    return {"videos": len(arrivals), "clips": clips, "e2e_s": round(times[-1], 2),
            "clips_per_s": round(clips / times[-1], 1), "first_s": round(times[0], 2),
            "p50_s": round(statistics.median(times), 2),
            "short_done_s": round(max(short), 2) if short else None, "long_done_s": long_,
            "startup_s": round(startup[0], 2) if startup else None,
            "arrivals": [[Path(p).stem, round(t, 3)] for p, t, _ in arrivals],
            "clips_per_s_after_startup": round(clips / (times[-1] - startup[0]), 1)
            if startup else None}


def plot(runs: list[dict[str, Any]], target: Path) -> None:
    """Videos done over time per run (long videos marked): the long-tail picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    colours = {"rayorch": "tab:blue", "raydata": "tab:orange"}
    for run in runs:
        times = sorted(t for _, t in run["arrivals"])
        style = "-" if run["rep"] == 0 else "--"
        ax.step(times, range(1, len(times) + 1), where="post", linestyle=style,
                color=colours[run["system"]], label=f"{run['system']} rep {run['rep']}")
        for name, t in run["arrivals"]:
            if name.startswith("long-"):
                ax.plot([t], [sorted(times).index(t) + 1], "o", color=colours[run["system"]])
        if run.get("startup_s"):
            ax.axvline(run["startup_s"], color=colours[run["system"]], linestyle=style,
                       alpha=0.3)
    ax.set_xlabel("seconds since the run started (faint lines: rayorch pools up)")
    ax.set_ylabel("videos done")
    ax.set_title("video job: videos done over time (dots: the long videos)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=40, help="short videos (2-9 s)")
    parser.add_argument("--long", type=float, nargs="*", default=[60.0, 150.0],
                        help="lengths of the long videos, seconds")
    parser.add_argument("--reps", type=int, default=2, help="runs per system (alternating)")
    parser.add_argument("--cpus", type=int, default=4, help="CPUs declared to Ray")
    parser.add_argument("--gpus", type=int, default=2, help="virtual GPUs (annotate actors)")
    parser.add_argument("--batch-size", type=int, default=8, help="clips per batch")
    parser.add_argument("--gpu-batch-ms", type=float, default=50.0)
    parser.add_argument("--gpu-clip-ms", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "out" / "video.json")
    parser.add_argument("--figure", type=Path, default=None,
                        help="also draw videos done over time to this PNG")
    parser.add_argument("--detectors", nargs="*", metavar="VIDEO",
                        help="only time the two cut detectors on these videos")
    args = parser.parse_args(argv)
    if args.detectors is not None:
        load = os.getloadavg()[0]
        rows = compare_detectors(args.detectors)
        print("| video | PySceneDetect (OpenCV) s | PyAV + ContentDetector s | cuts (both) |")
        print("| --- | ---: | ---: | --- |")
        for r in rows:
            same = r["scenedetect_opencv_cuts"] == r["pyav_contentdetector_cuts"]
            cuts = r["pyav_contentdetector_cuts"] if same else (
                f"{r['scenedetect_opencv_cuts']} vs {r['pyav_contentdetector_cuts']}")
            print(f"| {r['video']} | {r['scenedetect_opencv_s']} | "
                  f"{r['pyav_contentdetector_s']} | {cuts} |")
        print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")
        return 0
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    paths = make_corpus(CORPUS, args.short, list(args.long))
    ray.init(address="local", num_cpus=args.cpus, num_gpus=args.gpus, include_dashboard=False,
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
    load_before = os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    systems = [("rayorch", run_rayorch), ("raydata", run_raydata)]
    for rep in range(args.reps):
        for name, runner in systems if rep % 2 == 0 else systems[::-1]:
            record = {"system": name, "rep": rep, **describe(runner(paths, args))}
            print(json.dumps(record), file=sys.stderr, flush=True)
            runs.append(record)
    ray.shutdown()
    result = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)], "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    if args.figure:
        plot(runs, args.figure)
    print("| system | rep | videos | clips | wall s | clips/s | pools up s | clips/s after |"
          " first video s | median video s | last short s | long videos done s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in runs:
        longs = ", ".join(f"{k} {v}" for k, v in r["long_done_s"].items())
        print(f"| {r['system']} | {r['rep']} | {r['videos']} | {r['clips']} | {r['e2e_s']} | "
              f"{r['clips_per_s']} | {r['startup_s'] or '-'} | "
              f"{r['clips_per_s_after_startup'] or '-'} | {r['first_s']} | {r['p50_s']} | "
              f"{r['short_done_s']} | "
              f"{longs} |")
    print(f"load average {result['load_avg'][0]} -> {result['load_avg'][1]}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
