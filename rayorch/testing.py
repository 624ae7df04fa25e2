"""Test rigs: a private ``redis-server`` and a TCP proxy that loses replies.

:class:`RedisServer` runs on a free port in a temp dir and is stopped by PID; it never
touches a server it did not start (no FLUSHALL anywhere). :class:`ReplyDroppingProxy`
sits between a client and a server and, when armed, lets a request through but drops
its reply (a network failure after the server acted). Used by the test fixtures in
``tests/conftest.py`` and by the benchmarks in ``bench/``.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.program import PipelineBase, RayModule

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


class ReplyDroppingProxy:
    """A TCP proxy to ``127.0.0.1:target_port`` that can lose the reply to one request.

    After :meth:`drop_next_reply`, the next request containing ``match`` is forwarded
    to the server, its reply is read and thrown away, and the client's connection is
    closed: the server acted, the client cannot know. Other traffic passes unchanged.

    Example::

        with ReplyDroppingProxy(server.port) as proxy:
            store = open_store(f"redis://127.0.0.1:{proxy.port}/0?retries=0")
            proxy.drop_next_reply(COMMIT_BATCH.sha.encode())
            store.commit(run_id, reports)      # StoreUnavailableError; the commit happened
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._match: bytes | None = None
        self.dropped = 0
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="reply-dropping-proxy", daemon=True).start()

    def drop_next_reply(self, match: bytes = b"") -> None:
        """Arm: lose the reply to the next request whose bytes contain ``match``."""
        with self._lock:
            self._match = match

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            doomed = threading.Event()  # the reply to a forwarded request is to be lost
            threading.Thread(target=self._requests, args=(client, server, doomed),
                             daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, doomed),
                             daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket,
                  doomed: threading.Event) -> None:
        try:
            while chunk := client.recv(65536):
                with self._lock:
                    if self._match is not None and self._match in chunk:
                        self._match = None
                        doomed.set()
                server.sendall(chunk)
        except OSError:
            pass
        _close(client, server)

    def _replies(self, server: socket.socket, client: socket.socket,
                 doomed: threading.Event) -> None:
        try:
            while chunk := server.recv(65536):
                if doomed.is_set():
                    with self._lock:
                        self.dropped += 1
                    break
                client.sendall(chunk)
        except OSError:
            pass
        _close(client, server)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        _close(*sockets)

    def __enter__(self) -> ReplyDroppingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


class Echo:
    """A module that returns its inputs (batched)."""

    def __call__(self, xs: list[Any]) -> list[Any]:
        return xs


class EchoPipeline(PipelineBase):
    """The smallest pipeline: one Call ``echo`` on the root Domain (for store-level tests)."""

    def __init__(self) -> None:
        super().__init__()
        self.echo = RayModule(Echo, batch_size=4, num_cpus=0.1)

    def forward(self, xs: Any) -> Any:
        return self.echo(xs)


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
