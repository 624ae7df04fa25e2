"""Redis test rigs: a private ``redis-server`` and a local Redis Cluster.

:class:`RedisServer` runs on a free port in a temp dir and is stopped by PID; it never
touches a server it did not start (no FLUSHALL anywhere). :class:`RedisClusterNodes` joins
several of them into a cluster (optionally over TLS, :class:`TlsFiles`) whose nodes a test
can kill, pause and watch fail over. Used by the fixtures in ``tests/conftest.py`` and by the
benchmarks in ``bench/``; :mod:`rayorch.testing` re-exports every name.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rayorch.core.errors import RayorchError


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


__all__ = ["RedisClusterNodes", "RedisServer", "RedisServerError", "TlsFiles", "free_port",
           "redis_server_path"]
