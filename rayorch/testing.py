"""Test rigs: a private ``redis-server`` and a TCP proxy that loses replies.

:class:`RedisServer` runs on a free port in a temp dir and is stopped by PID; it never
touches a server it did not start (no FLUSHALL anywhere). :class:`ReplyDroppingProxy`
sits between a client and a server and, when armed, lets a request through but drops
its reply (a network failure after the server acted). Used by the test fixtures in
``tests/conftest.py`` and by the benchmarks in ``bench/``.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.program import PipelineBase, RayModule

_NOT_A_WORD = re.compile(
    r"^(#{1,6}|`{3,}|\\?[-\u2022\u2013\u2014*+\u00b7\u25e6]|[\divxlcdm.,()]+)$", re.IGNORECASE)


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
        self.extra_args: list[str] = []  # more redis-server options (e.g. cluster mode)
        self.bus_port = free_port()  # "{bus_port}" in extra_args (a cluster node's bus)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port and dir) and wait until it accepts connections.

        A first start whose port was taken between :func:`free_port` and the bind (another
        process on this machine got it first) retries on another free port.
        """
        for attempt in range(3):
            try:
                self._start_once()
                self._started = True
                return
            except RedisServerError:
                if getattr(self, "_started", False) or attempt == 2:
                    raise
                self.port, self.bus_port = free_port(), free_port()

    def _start_once(self) -> None:
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
        ports = {"{port}": str(self.port), "{bus_port}": str(self.bus_port)}
        args += [ports.get(a, a) for a in self.extra_args]
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
            self.proc.send_signal(signal.SIGCONT)  # a paused server could not stop
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


@dataclass(frozen=True)
class TlsFiles:
    """A test CA and a certificate for 127.0.0.1 signed by it (PEM files)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, workdir: Path) -> TlsFiles:
        """Generate them with the ``openssl`` command (valid for one day)."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RedisServerError("openssl is not installed (apt-get install openssl)")
        workdir.mkdir(parents=True, exist_ok=True)
        files = cls(workdir / "ca.crt", workdir / "server.crt", workdir / "server.key")
        ca_key, csr, ext = workdir / "ca.key", workdir / "server.csr", workdir / "san.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for args in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out",
             str(files.ca), "-days", "1", "-subj", "/CN=rayorch test CA"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files.key), "-out",
             str(csr), "-subj", "/CN=127.0.0.1"],
            ["x509", "-req", "-in", str(csr), "-CA", str(files.ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(files.cert), "-days", "1", "-extfile", str(ext)],
        ):
            subprocess.run([openssl, *args], capture_output=True, check=True, timeout=60)
        return files


class RedisClusterNodes:
    """A local Redis Cluster: ``masters`` masters with ``replicas`` replicas each, on free ports.

    Every node is a ``redis-server --cluster-enabled yes`` in its own directory under
    ``workdir``; :meth:`start` joins them with ``redis-cli --cluster create``. The node
    timeout is short (``node_timeout_ms``) so a killed master fails over in seconds, and
    a replica that lagged may still be promoted (``cluster-replica-validity-factor 0``):
    the worst case for a lineage store, on purpose.
    """

    def __init__(self, workdir: Path, *, masters: int = 3, replicas: int = 1,
                 password: str | None = None, tls: TlsFiles | None = None,
                 node_timeout_ms: int = 1000, start_timeout_s: float = 30.0) -> None:
        cli = shutil.which("redis-cli")
        if redis_server_path() is None or cli is None:
            raise RedisServerError(
                "redis-server and redis-cli are not installed (apt-get install redis-server)"
            )
        self.cli = cli
        self.workdir = workdir
        self.masters, self.replicas = masters, replicas
        self.password = password
        self.tls = tls
        self.node_timeout_ms = node_timeout_ms
        self.start_timeout_s = start_timeout_s
        self.nodes: list[RedisServer] = []
        for i in range(masters * (1 + replicas)):
            node_dir = workdir / f"node{i}"
            node_dir.mkdir(parents=True, exist_ok=True)
            node = RedisServer(node_dir, password=password, start_timeout_s=start_timeout_s)
            node.extra_args = [
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-port", "{bus_port}",  # both ports are picked again if taken
                "--cluster-node-timeout", str(node_timeout_ms),
                "--cluster-replica-validity-factor", "0",
                # A replica syncs at once (Redis waits 5 s for more replicas by default).
                "--repl-diskless-sync-delay", "0",
            ] + (["--masterauth", password] if password else [])
            if tls is not None:  # the node's port speaks TLS only, to clients and peers
                node.extra_args += [
                    "--port", "0", "--tls-port", "{port}", "--tls-cluster", "yes",
                    "--tls-replication", "yes", "--tls-auth-clients", "no",
                    "--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key),
                    "--tls-ca-cert-file", str(tls.ca),
                ]
            self.nodes.append(node)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{n.port}" for n in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://[:password@]host:port,...`` (every node); ``rediss+`` with TLS."""
        auth = f":{self.password}@" if self.password else ""
        if self.tls is None:
            return f"redis+cluster://{auth}{','.join(self.addresses)}"
        return f"rediss+cluster://{auth}{','.join(self.addresses)}?ssl_ca_certs={self.tls.ca}"

    def _cli_options(self) -> list[str]:
        options = ["-a", self.password, "--no-auth-warning"] if self.password else []
        if self.tls is not None:
            options += ["--tls", "--cacert", str(self.tls.ca)]
        return options

    def cli_call(self, node: int, *args: str, timeout_s: float = 10.0) -> str:
        """Run one ``redis-cli`` command against node ``node`` and return its output."""
        done = subprocess.run(
            [self.cli, "-h", "127.0.0.1", "-p", str(self.nodes[node].port), *self._cli_options(),
             *args],
            capture_output=True, timeout=timeout_s, check=False,
        )
        return done.stdout.decode(errors="replace")

    def start(self) -> None:
        """Start every node, create the cluster and wait until every slot is served."""
        for node in self.nodes:
            node.start()
        done = subprocess.run(
            [self.cli, *self._cli_options(), "--cluster", "create", *self.addresses,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, timeout=self.start_timeout_s, check=False,
        )
        if done.returncode != 0:
            self.stop()
            raise RedisServerError(f"redis-cli --cluster create failed: {done.stdout[-500:]!r}")
        self.wait_healthy()

    def wait_healthy(self, timeout_s: float | None = None) -> None:
        """Wait until every live node reports ``cluster_state:ok`` with ``masters`` masters
        and, when every node is up, every master has its replicas synced (``state=online``):
        a ``WAIT`` right after this returns does not time out on a replica still loading."""
        deadline = time.monotonic() + (timeout_s or self.start_timeout_s)
        while time.monotonic() < deadline:
            live = [i for i, n in enumerate(self.nodes) if n.alive]
            if (live and all(self._healthy(i) for i in live)
                    and (len(live) < len(self.nodes) or self._replicas_online())):
                return
            time.sleep(0.1)
        raise RedisServerError("the Redis Cluster did not become healthy in time")

    def _healthy(self, node: int) -> bool:
        info = self.cli_call(node, "cluster", "info")
        if "cluster_state:ok" not in info:
            return False
        replication = self.cli_call(node, "info", "replication")
        if "role:slave" in replication and "master_link_status:up" not in replication:
            return False  # a replica still syncing: a WAIT for it would time out
        return len(self.master_ports(node)) == self.masters

    def _replicas_online(self) -> bool:
        """Every master that serves slots sees ``replicas`` replicas done syncing."""
        by_port = {n.port: i for i, n in enumerate(self.nodes)}
        for port in self.master_ports():
            replication = self.cli_call(by_port[port], "info", "replication")
            if "role:master" not in replication:
                return False
            if replication.count("state=online") < self.replicas:
                return False
        return True

    def master_ports(self, via: int | None = None) -> list[int]:
        """Ports of the live masters that serve slots, as node ``via`` sees them."""
        via = via if via is not None else next(i for i, n in enumerate(self.nodes) if n.alive)
        ports = []
        for line in self.cli_call(via, "cluster", "nodes").splitlines():
            fields = line.split()
            if len(fields) > 8 and "master" in fields[2] and "fail" not in fields[2]:
                ports.append(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
        return sorted(ports)

    def master_of(self, key: str) -> int:
        """The index in :attr:`nodes` of the master that serves ``key`` now."""
        via = next(i for i, n in enumerate(self.nodes) if n.alive)
        slot = int(self.cli_call(via, "cluster", "keyslot", key).strip())
        for line in self.cli_call(via, "cluster", "nodes").splitlines():
            fields = line.split()
            if len(fields) <= 8 or "master" not in fields[2] or "fail" in fields[2]:
                continue
            for span in fields[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
                    return next(i for i, n in enumerate(self.nodes) if n.port == port)
        raise RedisServerError(f"no live master serves the slot of {key!r}")

    def replica_of(self, master: int) -> int:
        """The index in :attr:`nodes` of a live replica of node ``master``."""
        via = next(i for i, n in enumerate(self.nodes) if n.alive)
        lines = [line.split() for line in self.cli_call(via, "cluster", "nodes").splitlines()]
        port_of = {f[0]: int(f[1].split("@")[0].rsplit(":", 1)[1]) for f in lines if len(f) > 3}
        master_port = self.nodes[master].port
        for f in lines:
            if len(f) > 3 and "slave" in f[2] and port_of.get(f[3]) == master_port:
                return next(i for i, n in enumerate(self.nodes) if n.port == port_of[f[0]])
        raise RedisServerError(f"node {master} has no replica")

    def kill(self, node: int) -> None:
        """SIGKILL one node (a crashed machine)."""
        self.nodes[node].kill()

    def pause(self, node: int) -> None:
        """SIGSTOP one node: it neither answers nor replicates until :meth:`resume`."""
        proc = self.nodes[node].proc
        if proc is not None:
            proc.send_signal(signal.SIGSTOP)

    def resume(self, node: int) -> None:
        proc = self.nodes[node].proc
        if proc is not None:
            proc.send_signal(signal.SIGCONT)

    def wait_promoted(self, dead_port: int, timeout_s: float = 30.0) -> None:
        """Wait until the slots of the dead master at ``dead_port`` are served by another node."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ports = self.master_ports()
            if dead_port not in ports and len(ports) == self.masters:
                self.wait_healthy(max(1.0, deadline - time.monotonic()))
                return
            time.sleep(0.1)
        raise RedisServerError(f"no replica took over the master on port {dead_port} in time")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterNodes:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
