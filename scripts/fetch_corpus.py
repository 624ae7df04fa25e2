#!/usr/bin/env python3
"""Fetch a corpus of real PDFs from Debian documentation packages into a local cache.

Only ``apt-get download <package>`` and ``dpkg -x`` reach outside: every PDF comes from
the Debian archive configured on this machine. Idempotent: a package whose cache
directory holds a ``manifest.json`` is not fetched again.

    python scripts/fetch_corpus.py                          # the CI-sized package
    python scripts/fetch_corpus.py --packages texlive-humanities-doc texlive-science-doc
    python scripts/fetch_corpus.py --all                    # all three packages

Layout: ``<cache>/<package>/<flattened/path>.pdf`` plus ``manifest.json``
(``{"package", "version", "pdfs": [{"file", "pages", "bytes"}]}``; ``pages`` is -1 for
a file PyMuPDF cannot open).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CI_PACKAGE = "texlive-humanities-doc"
ALL_PACKAGES = (CI_PACKAGE, "texlive-latex-base-doc", "texlive-science-doc")
DEFAULT_CACHE = Path(".cache/corpus")
MANIFEST = "manifest.json"


class FetchError(RuntimeError):
    """A package could not be downloaded or unpacked; the message says what to do."""


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def _page_count(path: Path) -> int:
    import pymupdf

    try:
        with pymupdf.open(path) as doc:  # type: ignore[no-untyped-call]
            return int(doc.page_count)
    except Exception:  # any unreadable file counts as -1; the corpus keeps it for bad-input runs
        return -1


def _flat_name(relative: Path) -> str:
    """``usr/share/doc/texlive-doc/latex/foo/bar.pdf`` -> ``latex__foo__bar.pdf``."""
    parts = list(relative.parts)
    for marker in ("texlive-doc", "doc"):
        if marker in parts:
            parts = parts[parts.index(marker) + 1 :]
            break
    return "__".join(parts)


def download_and_unpack(package: str, tmp: Path) -> tuple[str, Path]:
    """``apt-get download`` then ``dpkg -x`` into ``tmp/root``; returns (version, root)."""
    download = _run(["apt-get", "download", package], tmp)
    debs = sorted(tmp.glob("*.deb"))
    if download.returncode != 0 or not debs:
        raise FetchError(
            f"apt-get download {package} failed: {download.stderr.strip()[-300:]}\n"
            "Run `apt-get update` (as root) or pass --update, then try again."
        )
    version = debs[0].name.split("_")[1] if "_" in debs[0].name else "unknown"
    unpacked = tmp / "root"
    extract = _run(["dpkg", "-x", str(debs[0]), str(unpacked)], tmp)
    if extract.returncode != 0:
        raise FetchError(f"dpkg -x {debs[0].name} failed: {extract.stderr.strip()[-300:]}")
    return version, unpacked


def fetch_package(package: str, cache: Path, *, update: bool = False) -> dict[str, Any]:
    """Download ``package``, extract its PDFs into ``cache/package``; return its manifest."""
    cache = cache.resolve()  # apt-get and dpkg run in a temporary working directory
    target = cache / package
    manifest_path = target / MANIFEST
    if manifest_path.exists():
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        return manifest
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise FetchError("apt-get and dpkg are needed: run this on Debian or Ubuntu")
    if update:
        _run(["apt-get", "update"], Path.cwd())
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp_dir:
        version, unpacked = download_and_unpack(package, Path(tmp_dir))
        pdfs = []
        for source in sorted(unpacked.rglob("*.pdf")):
            if not source.is_file() or source.is_symlink():
                continue
            name = _flat_name(source.relative_to(unpacked))
            shutil.copyfile(source, target / name)
            pdfs.append({"file": name, "pages": _page_count(target / name),
                         "bytes": source.stat().st_size})
    manifest = {"package": package, "version": version, "pdfs": pdfs}
    # Written last: its presence marks the package as complete (idempotence).
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest


def corpus_paths(cache: Path, packages: tuple[str, ...] = (CI_PACKAGE,)) -> list[Path]:
    """The readable PDFs of the fetched ``packages``, in a stable order."""
    paths: list[Path] = []
    for package in packages:
        manifest_path = cache / package / MANIFEST
        if not manifest_path.exists():
            continue
        manifest = json.loads(manifest_path.read_text())
        paths += [cache / package / e["file"] for e in manifest["pdfs"] if e["pages"] > 0]
    return paths


def summarize(manifest: dict[str, Any]) -> str:
    """One line: PDFs, readable ones, page range and median, total size."""
    pages = [e["pages"] for e in manifest["pdfs"] if e["pages"] > 0]
    unreadable = sum(1 for e in manifest["pdfs"] if e["pages"] <= 0)
    size_mb = sum(e["bytes"] for e in manifest["pdfs"]) / 1e6
    if not pages:
        return f"{manifest['package']}: no readable PDFs ({unreadable} unreadable)"
    return (
        f"{manifest['package']} {manifest['version']}: {len(manifest['pdfs'])} PDFs "
        f"({unreadable} unreadable), {sum(pages)} pages, pages/PDF min {min(pages)} "
        f"median {statistics.median(pages):g} max {max(pages)}, {size_mb:.1f} MB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--packages", nargs="+", default=[CI_PACKAGE], metavar="PKG")
    group.add_argument("--all", action="store_true", help=f"fetch {', '.join(ALL_PACKAGES)}")
    parser.add_argument("--update", action="store_true", help="run apt-get update first")
    args = parser.parse_args(argv)
    packages = list(ALL_PACKAGES) if args.all else args.packages
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    status = 0
    for package in packages:
        try:
            manifest = fetch_package(package, args.cache_dir, update=args.update)
        except FetchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        print(summarize(manifest))
    return status


if __name__ == "__main__":
    sys.exit(main())
