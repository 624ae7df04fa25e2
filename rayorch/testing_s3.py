"""An HTTP proxy in front of an S3 server, for the object-store tests and benchmarks: it
counts requests by method and injects faults, 503 SlowDown answers (throttling) and reset
connections (an outage). Test support only: nothing in rayorch's runtime imports it."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

from rayorch.testing import free_port

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class FaultyProxy:
    """``endpoint`` forwards to ``upstream``; :meth:`throttle` and :meth:`down` inject."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._throttle = 0
        self._down_until = 0.0
        self.throttled = 0
        self.resets = 0
        self.requests: Counter[str] = Counter()
        """Requests forwarded, by method (``GET``, ``PUT``, ``HEAD``, ``DELETE``, ``POST``)."""
        self.by_path: Counter[tuple[str, str]] = Counter()
        """Requests answered, by ``(method, path)`` (the path without its query: path-style
        ``/bucket/key``)."""
        self.bytes_out: Counter[str] = Counter()
        """Body bytes of the GET answers, by path: what was downloaded of each object."""
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True

    def throttle(self, requests: int) -> None:
        """The next ``requests`` requests answer 503 SlowDown."""
        with self._lock:
            self._throttle = requests

    def down(self, seconds: float) -> None:
        """For ``seconds``, every request's connection is reset without an answer."""
        with self._lock:
            self._down_until = time.monotonic() + seconds

    def _fault(self, method: str) -> str | None:
        with self._lock:
            self.requests[method] += 1
            if time.monotonic() < self._down_until:
                self.resets += 1
                return "reset"
            if self._throttle > 0:
                self._throttle -= 1
                self.throttled += 1
                return "throttle"
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._fault(self.command)
                if fault == "reset":
                    self.close_connection = True
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.connection.close()
                    return
                if fault == "throttle":
                    self.send_response(503, "Slow Down")
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname or "127.0.0.1",
                                                  proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection", "keep-alive")}
                conn.request(self.command, self.path, body=body, headers=headers)
                reply = conn.getresponse()
                data = reply.read()
                path = urlsplit(self.path).path
                with proxy._lock:
                    proxy.by_path[(self.command, path)] += 1
                    if self.command == "GET":
                        proxy.bytes_out[path] += len(data)
                self.send_response(reply.status, reply.reason)
                for key, value in reply.getheaders():
                    if key.lower() not in ("connection", "keep-alive", "transfer-encoding",
                                           "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        return Handler

    def __enter__(self) -> FaultyProxy:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
