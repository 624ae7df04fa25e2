"""Test rigs: a TCP proxy that loses replies, small pipelines and PDFs, text comparisons.

:class:`ReplyDroppingProxy` sits between a client and a server and, when armed, lets a
request through but drops its reply (a network failure after the server acted). The Redis
rigs (:class:`RedisServer`, :class:`RedisClusterNodes`, ...) live in
:mod:`rayorch.testing_redis` and are importable from here too. Used by the test fixtures
in ``tests/conftest.py`` and by the benchmarks in ``bench/``.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rayorch.core.program import PipelineBase, RayModule
from rayorch.testing_redis import (
    RedisClusterNodes,
    RedisServer,
    RedisServerError,
    TlsFiles,
    free_port,
    redis_server_path,
)

_NOT_A_WORD = re.compile(
    r"^(#{1,6}|`{3,}|\\?[-\u2022\u2013\u2014*+\u00b7\u25e6]|[\divxlcdm.,()]+)$", re.IGNORECASE)


class ReplyDroppingProxy:
    """A TCP proxy to ``127.0.0.1:target_port`` that can lose the reply to one request.

    After :meth:`drop_next_reply`, the next request containing ``match`` is forwarded
    to the server, its reply is read and thrown away, and the client's connection is
    closed: the server acted, the client cannot know. Other traffic passes unchanged.
    After :meth:`hold_next_reply` that reply is kept until :meth:`release_reply`: the
    client waits right after the server acted (``reply_held`` is set meanwhile).

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
        self.dropped_by_match: Counter[bytes] = Counter()  # what each lost reply answered
        self._swallow: bytes | None = None
        self._refuse_s = 0.0
        self._refuse_until = 0.0
        self.swallowed = 0
        self._hold: bytes | None = None
        self.reply_held = threading.Event()  # a held reply arrived from the server
        self._released = threading.Event()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="reply-dropping-proxy", daemon=True).start()

    def drop_next_reply(self, match: bytes = b"") -> None:
        """Arm: lose the reply to the next request whose bytes contain ``match``."""
        with self._lock:
            self._match = match

    def drop_next_request(self, match: bytes, refuse_s: float = 0.0) -> None:
        """Arm: the next request containing ``match`` never reaches the server (its client's
        connection is closed) and new connections are refused for ``refuse_s`` seconds — a
        network partition that starts just before that request."""
        with self._lock:
            self._swallow = match
            self._refuse_s = refuse_s

    def hold_next_reply(self, match: bytes) -> None:
        """Arm: keep the reply to the next request containing ``match`` until
        :meth:`release_reply` (the server has acted; its client waits for the answer)."""
        with self._lock:
            self._hold = match
            self._released.clear()
            self.reply_held.clear()

    def release_reply(self) -> None:
        """Send the held reply on (and any held later) to its client."""
        self._released.set()

    @property
    def armed(self) -> bool:
        """True until the armed request has gone through (its reply then is lost)."""
        with self._lock:
            return self._match is not None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if time.monotonic() < self._refuse_until:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            doomed: list[bytes] = []  # set: the reply to a forwarded request is to be lost
            held = threading.Event()  # set: the reply to a forwarded request is to be held
            threading.Thread(target=self._requests, args=(client, server, doomed, held),
                             daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, doomed, held),
                             daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket,
                  doomed: list[bytes], held: threading.Event) -> None:
        try:
            while chunk := client.recv(65536):
                with self._lock:
                    if self._swallow is not None and self._swallow in chunk:
                        self._swallow = None
                        self.swallowed += 1
                        self._refuse_until = time.monotonic() + self._refuse_s
                        break
                    if self._match is not None and self._match in chunk:
                        doomed.append(self._match)
                        self._match = None
                    if self._hold is not None and self._hold in chunk:
                        held.set()
                        self._hold = None
                server.sendall(chunk)
        except OSError:
            pass
        _close(client, server)

    def _replies(self, server: socket.socket, client: socket.socket,
                 doomed: list[bytes], held: threading.Event) -> None:
        try:
            while chunk := server.recv(65536):
                if doomed:
                    with self._lock:
                        self.dropped += 1
                        self.dropped_by_match[doomed[0]] += 1
                    break
                if held.is_set():
                    held.clear()
                    self.reply_held.set()
                    self._released.wait()
                client.sendall(chunk)
        except OSError:
            pass
        _close(client, server)

    def close(self) -> None:
        self._closed = True
        self._released.set()
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


def write_scanned_pdf(source: str | Path, path: str | Path) -> str:
    """The top third of ``source``'s first page, rendered to pixels and saved at ``path`` as
    an image-only PDF (a scan: no text layer). Returns the text layer of that region of the
    original page (what OCR should find). Needs PyMuPDF (the ``pdf`` extra)."""
    pymupdf: Any = importlib.import_module("pymupdf")
    with pymupdf.open(source) as src:
        page = src[0]
        clip = pymupdf.Rect(0, 0, page.rect.width, page.rect.height / 3)
        expected = page.get_text(clip=clip)
        pixmap = page.get_pixmap(dpi=150, clip=clip, colorspace=pymupdf.csGRAY)
    with pymupdf.open() as doc:
        target = doc.new_page(width=clip.width, height=clip.height)
        target.insert_image(target.rect, pixmap=pixmap)
        doc.save(path)
    return str(expected)


def one_page_pdf(number: int, words: int = 200) -> bytes:
    """A small born-digital PDF of one page (a title and ``words`` words, distinct per
    ``number``), for runs over many small documents. Needs PyMuPDF (the ``pdf`` extra)."""
    pymupdf: Any = importlib.import_module("pymupdf")
    text = " ".join(f"word{(number * 7 + i) % 997}" for i in range(words))
    with pymupdf.open() as doc:
        page = doc.new_page()
        page.insert_text((72, 72), f"Document {number}", fontsize=16)
        page.insert_textbox(pymupdf.Rect(72, 96, 540, 760), text, fontsize=10)
        return bytes(doc.tobytes(garbage=3, deflate=True))


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

    Ligatures expanded; left out: Markdown markup tokens (``#``, bullets, code fences,
    escapes), bare numbers
    (running page numbers and margin line numbers are dropped from Markdown) and the
    first halves of words hyphenated at a line end (Markdown joins them).

    >>> sorted(text_words("## The \\ufb01rst 12 words\\n- one").elements())
    ['The', 'first', 'one', 'words']
    """
    from rayorch.pipelines.document.pdf_markdown import normalise_ligatures

    return Counter(w for w in normalise_ligatures(text).split()
                   if not _NOT_A_WORD.match(w) and not w.endswith("-"))


def shared_share(expected: Counter[str], got: Counter[str]) -> tuple[float, float]:
    """(recall, precision) of ``got``'s words against ``expected``'s, as multisets."""
    common = sum((expected & got).values())
    return common / max(sum(expected.values()), 1), common / max(sum(got.values()), 1)


__all__ = ["Echo", "EchoPipeline", "RedisClusterNodes", "RedisServer", "RedisServerError",
           "ReplyDroppingProxy", "TlsFiles", "free_port", "one_page_pdf", "redis_server_path",
           "shared_share", "text_words", "word_recall", "write_scanned_pdf"]
