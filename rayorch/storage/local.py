"""Local files behind the storage interface: POSIX writes made whole and durable.

``create`` writes a hidden temp file, fsyncs it, links it to its name (``link`` never
replaces: the conditional create of a local disk) and fsyncs the directory; ``put`` (and
``put_file``, from a local file) replaces by ``rename``. A killed writer leaves at most a
hidden ``.rayorch-tmp-*`` file, which no reader lists.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from rayorch.storage.location import Location, StorageError, check_key
from rayorch.storage.objects import PAGE, ObjectInfo

TEMP_PREFIX = ".rayorch-tmp-"
COPY_CHUNK = 1 << 20


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _failed(what: str, path: Path, exc: OSError) -> StorageError:
    return StorageError(f"cannot {what} {path}: {exc.strerror or exc}")


class LocalStorage:
    """A directory; keys are relative paths below it."""

    is_local = True

    def __init__(self, location: Location) -> None:
        self.location = location
        self.root = Path(location.root)

    @property
    def url(self) -> str:
        return self.location.url

    def path(self, key: str) -> Path:
        return self.root / check_key(key) if key else self.root

    def local_path(self, key: str) -> Path | None:
        return self.path(key)

    def _write(self, key: str, data: bytes | Path, *, replace: bool) -> bool:
        """``data`` (bytes, or a local file's) to ``key``: a temporary file, fsync'd, then
        renamed over ``key`` (``replace``) or linked to it unless it exists."""
        target = self.path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _failed("create the directory", target.parent, exc) from None
        tmp = target.with_name(f"{TEMP_PREFIX}{target.name}-{secrets.token_hex(4)}")
        try:
            with open(tmp, "xb") as f:
                if isinstance(data, Path):
                    with open(data, "rb") as source:
                        shutil.copyfileobj(source, f, COPY_CHUNK)
                else:
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(tmp, target)
            else:
                try:
                    os.link(tmp, target)
                except FileExistsError:
                    return False
        except OSError as exc:
            raise _failed("write", target, exc) from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        fsync_dir(target.parent)
        return True

    def create(self, key: str, data: bytes) -> bool:
        return self._write(key, data, replace=False)

    def put(self, key: str, data: bytes) -> None:
        self._write(key, data, replace=True)

    def put_file(self, key: str, path: Path) -> None:
        self._write(key, path, replace=True)

    def read(self, key: str) -> bytes:
        path = self.path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _failed("read", path, exc) from None

    def read_range(self, key: str, start: int, end: int) -> bytes:
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(max(0, end - start))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _failed("read", path, exc) from None

    def head(self, key: str) -> ObjectInfo | None:
        path = self.path(key)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _failed("stat", path, exc) from None
        if not path.is_file():
            return None
        return ObjectInfo(key, st.st_size, None, st.st_mtime, mtime_ns=st.st_mtime_ns)

    def delete(self, key: str) -> None:
        path = self.path(key)
        try:
            path.unlink(missing_ok=True)
        except IsADirectoryError:
            return
        except OSError as exc:
            raise _failed("delete", path, exc) from None

    def walk(self, folder: str = "") -> Iterator[list[ObjectInfo]]:
        """Every file below the folder key ``folder`` ("" = all), in key order, one page per
        directory; hidden temp files are left out."""
        folder = folder.strip("/")
        yield from self._walk(self.path(folder), folder)

    def _walk(self, directory: Path, key: str) -> Iterator[list[ObjectInfo]]:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise _failed("list", directory, exc) from None
        page: list[ObjectInfo] = []
        folders: list[os.DirEntry[str]] = []
        for entry in entries:
            if entry.name.startswith(TEMP_PREFIX):
                continue
            name = f"{key}/{entry.name}" if key else entry.name
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat()
                page.append(ObjectInfo(name, st.st_size, None, st.st_mtime,
                                        mtime_ns=st.st_mtime_ns))
        if page:
            yield page
        for entry in folders:
            yield from self._walk(Path(entry.path), f"{key}/{entry.name}" if key else entry.name)

    def names(self, prefix: str = "") -> Iterator[list[str]]:
        """Names of the files directly in the root that start with ``prefix`` (hidden ones
        included), sorted, a page of up to 1,000 at a time."""
        try:
            found = sorted(e.name for e in os.scandir(self.root)
                           if e.name.startswith(prefix) and e.is_file(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise _failed("list", self.root, exc) from None
        for start in range(0, len(found), PAGE):
            yield found[start:start + PAGE]

    def exists_dir(self) -> bool:
        return self.root.is_dir()

    def make_dir(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _failed("create the directory", self.root, exc) from None

    def remove_empty_dirs(self, prefix: str = "") -> None:
        base = self.path(prefix) if prefix else self.root
        if not base.is_dir() or base.is_symlink():
            return
        for folder in sorted((p for p in base.rglob("*") if p.is_dir() and not p.is_symlink()),
                             key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()
