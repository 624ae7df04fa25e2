"""Serving the web view: uvicorn on a thread (``Pipeline.run(ui=True)``) or in the foreground
(``rayorch ui``).

Loopback (127.0.0.1, ::1, localhost) by default; any other host exposes the lineage store's
contents, so the server then requires a random token and says the address with it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
import sys
import threading
import time
from typing import Any

from rayorch.core.errors import MissingExtraError, RayorchError
from rayorch.store.base import LineageStore

DEFAULT_HOST = "127.0.0.1"


class UiError(RayorchError):
    """The web view cannot start (a host it may not bind without a token, a busy port)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_ui_extra() -> None:
    """Raise :class:`MissingExtraError` unless starlette, uvicorn and jinja2 import."""
    for package in ("starlette", "uvicorn", "jinja2"):
        try:
            __import__(package)
        except ImportError as exc:
            raise MissingExtraError("the web view (rayorch ui)", package, "ui") from exc


class UiServer:
    """The web view of ``store`` on ``host:port`` (port 0: a free one), in a thread.

    ``token``: None on loopback; elsewhere a fresh random one unless given.

    >>> with UiServer(store) as server:          # doctest: +SKIP
    ...     print(server.url)                     # http://127.0.0.1:8765/
    """

    def __init__(self, store: LineageStore, *, host: str = DEFAULT_HOST, port: int = 0,
                 token: str | None = None) -> None:
        require_ui_extra()
        import uvicorn

        from rayorch.ui.app import build_app

        if token is None and not is_loopback(host):
            token = secrets.token_urlsafe(24)
        self.host, self.token = host, token
        config = uvicorn.Config(build_app(store, token=token), host=host, port=port,
                                log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.port = port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        base = f"http://{host}:{self.port}/"
        return base + (f"?token={self.token}" if self.token else "")

    def start(self, timeout_s: float = 10.0) -> UiServer:
        """Start serving on a daemon thread; returns once the socket listens."""
        self._thread = threading.Thread(target=self._run, name="rayorch-ui", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started and self._thread.is_alive() \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            raise UiError(f"the web view could not listen on {self.host}:{self.port} "
                          "(is the port in use?)")
        self.port = self._bound_port()
        return self

    def _run(self) -> None:
        asyncio.run(self._server.serve())

    def _bound_port(self) -> int:
        for server in getattr(self._server, "servers", []):
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self.port

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C raises ``KeyboardInterrupt`` here)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=0.5)

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> UiServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_run(handle: Any, *, host: str = DEFAULT_HOST, port: int = 0) -> UiServer:
    """Serve ``handle``'s store while the run lasts (``Pipeline.run(..., ui=True)``); says
    the address on stderr. The server stops when the handle closes."""
    server = UiServer(handle.store, host=host, port=port).start()
    print(f"rayorch: web view of run {handle.run_id} at {server.url}runs/{handle.run_id}"
          if not server.token else
          f"rayorch: web view of run {handle.run_id} at {server.url}", file=sys.stderr)

    def watch() -> None:
        while not getattr(handle, "_closed", True):
            time.sleep(0.5)
        server.stop()

    threading.Thread(target=watch, name="rayorch-ui-watch", daemon=True).start()
    return server


__all__ = ["DEFAULT_HOST", "UiError", "UiServer", "is_loopback", "require_ui_extra",
           "serve_run"]
