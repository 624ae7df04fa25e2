#!/usr/bin/env python3
"""Fetch real short videos from Debian packages into a local cache (for the video job).

Only ``apt-get download <package>`` and ``dpkg -x`` reach outside (the helpers of
``scripts/fetch_corpus.py``). Idempotent: a package whose cache directory holds a
``manifest.json`` is not fetched again.

    python scripts/fetch_videos.py                 # both packages (~12 MB of .deb)

Packages (found with ``apt-cache search`` then ``dpkg -c``; most "-data" packages of
games ship no video): ``python3-imageio`` (``cockatoo.mp4``, 14 s 1280x720 H.264 with
one real cut; ``realshort.mp4``, 1.2 s 320x240) and ``gnome-user-docs``
(``display-dual-monitors.webm``, 37 s 1024x768 VP8 screencast with sparse cues).

Layout: ``<cache>/<package>/<name>`` plus ``manifest.json``
(``{"package", "version", "videos": [{"file", "bytes", "duration_s", "width", "height",
"codec"}]}``; ``duration_s`` is -1 for a file PyAV cannot open).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_corpus import FetchError, download_and_unpack

PACKAGES = ("python3-imageio", "gnome-user-docs")
SUFFIXES = (".mp4", ".webm", ".ogv", ".mkv", ".avi", ".mov")
DEFAULT_CACHE = Path(".cache/videos")
MANIFEST = "manifest.json"


def _describe(path: Path) -> dict[str, Any]:
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            return {"duration_s": round((container.duration or 0) / 1e6, 3),
                    "width": stream.width, "height": stream.height,
                    "codec": stream.codec_context.name}
    except Exception:  # an unreadable file stays in the corpus for bad-input runs
        return {"duration_s": -1, "width": 0, "height": 0, "codec": None}


def fetch_package(package: str, cache: Path, *, update: bool = False) -> dict[str, Any]:
    """Download ``package``, copy its videos into ``cache/package``; return its manifest."""
    cache = cache.resolve()
    target = cache / package
    manifest_path = target / MANIFEST
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        return manifest
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise FetchError("apt-get and dpkg are needed: run this on Debian or Ubuntu")
    if update:
        import subprocess

        subprocess.run(["apt-get", "update"], capture_output=True, check=False)
    target.mkdir(parents=True, exist_ok=True)
    videos = []
    with tempfile.TemporaryDirectory(dir=cache) as tmp_dir:
        version, unpacked = download_and_unpack(package, Path(tmp_dir))
        for source in sorted(unpacked.rglob("*")):
            if source.suffix.lower() not in SUFFIXES or source.is_symlink():
                continue
            if not source.is_file() or (target / source.name).exists():
                continue
            shutil.copyfile(source, target / source.name)
            videos.append({"file": source.name, "bytes": source.stat().st_size,
                           **_describe(target / source.name)})
    manifest = {"package": package, "version": version, "videos": videos}
    manifest_path.write_text(json.dumps(manifest, indent=1))  # last: marks completion
    return manifest


def video_paths(cache: Path, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The readable videos of the fetched ``packages``, in a stable order."""
    paths: list[Path] = []
    for package in packages:
        manifest_path = cache / package / MANIFEST
        if manifest_path.exists():
            manifest = json.loads(manifest_path.read_text())
            paths += [cache / package / v["file"] for v in manifest["videos"]
                      if v["duration_s"] > 0]
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES), metavar="PKG")
    parser.add_argument("--update", action="store_true", help="run apt-get update first")
    args = parser.parse_args(argv)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    status = 0
    for package in args.packages:
        try:
            manifest = fetch_package(package, args.cache_dir, update=args.update)
        except FetchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        for video in manifest["videos"]:
            print(f"{package} {manifest['version']}: {video['file']} {video['bytes']} bytes, "
                  f"{video['duration_s']} s, {video['width']}x{video['height']} {video['codec']}")
    return status


if __name__ == "__main__":
    sys.exit(main())
