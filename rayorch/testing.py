"""A private ``redis-server`` for tests and benchmarks: free port, temp dir, stopped by PID.

Never touches a server it did not start (no FLUSHALL anywhere). Used by the test
fixtures in ``tests/conftest.py`` and by the benchmarks in ``bench/``.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import TracebackType

from rayorch.core.errors import RayorchError

_NOT_A_WORD = re.compile(r"^(#{1,6}|[-\u2022\u2013\u2014*\u00b7\u25e6]|[\divxlcdm.,()]+)$",
                         re.IGNORECASE)


class RedisServerError(RayorchError):
    """redis-server is missing or did not start."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_path() -> str | None:
    """The redis-server executable, or None when it is not installed."""
    return shutil.which("redis-server")


class RedisServer:
    """A redis-server on a free port with its data in ``workdir``.

    ``aof=True`` turns on the append-only file with ``appendfsync always``, so
    :meth:`kill` (SIGKILL) then :meth:`start` loses no acknowledged write.
    """

    def __init__(self, workdir: Path, *, aof: bool = False, password: str | None = None,
                 start_timeout_s: float = 10.0) -> None:
        exe = redis_server_path()
        if exe is None:
            raise RedisServerError(
                "redis-server is not installed (Debian: apt-get install redis-server)"
            )
        self.exe = exe
        self.workdir = workdir
        self.aof = aof
        self.password = password
        self.start_timeout_s = start_timeout_s
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port and dir) and wait until it accepts connections."""
        args = [
            self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
            "--save", "", "--daemonize", "no", "--loglevel", "warning",
        ]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.kill()
        raise RedisServerError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        """SIGKILL the server (a crash); :meth:`start` brings it back on the same port and dir."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        """Stop the server cleanly (SIGTERM, SIGKILL if it lingers)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def word_recall(expected: str, ocr: str) -> float:
    """The share of ``expected``'s words (4+ letters) found in an OCR text, spaces aside.

    PP-OCR's recognizer often drops the spaces between words, so the OCR text is
    compared squeezed (lower-case letters and digits only).

    >>> word_recall("Lineage keeps every page", "lineagekeeps everypage")
    1.0
    """
    wanted = {w.lower() for w in re.findall(r"[A-Za-z]{4,}", expected)}
    found = re.sub(r"[^a-z0-9]", "", ocr.lower())
    return sum(1 for w in wanted if w in found) / max(len(wanted), 1)


def text_words(text: str) -> Counter[str]:
    """The words of a page text or its Markdown, to compare the two.

    Ligatures expanded; left out: Markdown markup tokens (``#``, bullets), bare numbers
    (running page numbers and margin line numbers are dropped from Markdown) and the
    first halves of words hyphenated at a line end (Markdown joins them).

    >>> sorted(text_words("## The \\ufb01rst 12 words\\n- one").elements())
    ['The', 'first', 'one', 'words']
    """
    from rayorch.pipelines.pdf_markdown import normalise_ligatures

    return Counter(w for w in normalise_ligatures(text).split()
                   if not _NOT_A_WORD.match(w) and not w.endswith("-"))


def shared_share(expected: Counter[str], got: Counter[str]) -> tuple[float, float]:
    """(recall, precision) of ``got``'s words against ``expected``'s, as multisets."""
    common = sum((expected & got).values())
    return common / max(sum(expected.values()), 1), common / max(sum(got.values()), 1)
