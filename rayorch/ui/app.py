"""The web view's routes: a read-only Starlette app over one lineage store.

Pages (every one paginated where it lists, each also served to the page's own poller):

    /                                   the runs
    /runs/RUN                           progress chart, per Call, drivers and leases, failures
    /runs/RUN/sources[?only=failed]     the sources and their state
    /runs/RUN/sources/ENTITY            a source's (or page's) lineage: Grains, attempts
    /runs/RUN/pages/SOURCE.PAGE         a page's layout regions on its image, what each read
    /runs/RUN/failures/CAUSE-ID         the failed Grains of one cause, linking to sources
    /runs/RUN/timeline                  per-Call windows, retries, failovers, throughput
    /runs/RUN/audit                     the audit, computed when asked

Trust: the store is untrusted input. Templates autoescape every value; links carry ids
quoted; no value from the store reaches a script (the one script is a static file that
re-fetches the page), and the Content-Security-Policy allows scripts and styles from this
server alone. Only GET and HEAD are routed. With a token (``rayorch ui --host``), every
request must carry it (``?token=``, then a cookie, or ``Authorization: Bearer``).
"""

from __future__ import annotations

import hmac
import sys
import time
from collections.abc import Callable
from pathlib import Path as FilePath
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rayorch.core.errors import InvalidPathError, RayorchError
from rayorch.core.ids import format_grain, format_path, parse_path
from rayorch.core.words import format_age, plural
from rayorch.inspect.timeline import format_seconds
from rayorch.store.base import LineageStore
from rayorch.store.errors import InvalidRunIdError, RunNotFoundError, StoreClosedError
from rayorch.ui import pages
from rayorch.ui.page_view import PageImages
from rayorch.ui.pages import PageNotFound, Runs

HERE = FilePath(__file__).parent
TOKEN_COOKIE = "rayorch_ui_token"
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
     b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update({
        "u": lambda v: quote(str(v), safe=""),
        "secs": lambda v: "-" if v is None else format_seconds(float(v)),
        "age": format_age,
        "when": lambda ts: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-",
        "path": format_path,
        "grain": format_grain,
        "num": lambda n: "?" if n is None else f"{n:,}",
        "plural": plural,
        "rate": lambda v: f"{v:.1f}" if v >= 10 else f"{v:.2f}",
        "short": lambda v, n=160: (s if len(s := str(v)) <= n else s[: n - 1] + "\u2026"),
    })
    return env


class UiApp:
    """The routes over ``store``; ``token``: required on every request when given."""

    def __init__(self, store: LineageStore, *, token: str | None = None) -> None:
        self.runs = Runs(store)
        self.images = PageImages()
        self.env = _templates()
        for name in self.env.list_templates():  # compiled once, now, not in a first request
            self.env.get_template(name)
        self.token = token
        routes = [
            Route("/", self.index), Route("/runs/{run_id}", self.run),
            Route("/runs/{run_id}/sources", self.sources),
            Route("/runs/{run_id}/sources/{entity}", self.entity),
            Route("/runs/{run_id}/failures/{key}", self.failures),
            Route("/runs/{run_id}/timeline", self.timeline),
            Route("/runs/{run_id}/audit", self.audit),
            Route("/runs/{run_id}/pages/{entity}", self.page),
            Route("/runs/{run_id}/pages/{entity}/image.png", self.page_image),
            Route("/runs/{run_id}/pages/{entity}/regions/{order:int}.png", self.region_image),
            Route("/metrics", self.metrics),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        self.starlette = Starlette(routes=routes, exception_handlers={
            404: self._not_found, 405: self._not_allowed})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.starlette(scope, receive, send)
            return
        set_cookie = False
        if self.token is not None:
            request = Request(scope)
            given = request.query_params.get("token")
            set_cookie = given is not None and _same(given, self.token)
            if not set_cookie:
                given = request.cookies.get(TOKEN_COOKIE) or _bearer(request)
            if given is None or not _same(given, self.token):
                page = self._page("error.html", 401, title="token required", message=(
                    "This web view needs its token: open the address `rayorch ui` printed "
                    "(it ends in ?token=...)."))
                await _with_headers(page, False, "")(scope, receive, send)
                return
        await _with_headers(self.starlette, set_cookie, self.token or "")(scope, receive, send)

    # -- pages -------------------------------------------------------------------------
    def _page(self, template: str, http_status: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(template).render(**context)
        return HTMLResponse(html, status_code=http_status)

    async def _serve(self, template: str, build: Callable[[], dict[str, Any]]) -> Response:
        """Build the page in a worker thread (store reads block); errors become pages."""
        return await run_in_threadpool(self._build, template, build)

    def _build(self, template: str, build: Callable[[], dict[str, Any]]) -> Response:
        try:
            return self._page(template, **build())
        except (RunNotFoundError, InvalidRunIdError) as exc:
            return self._page("error.html", 404, title="no such run", message=str(exc))
        except (PageNotFound, InvalidPathError) as exc:
            return self._page("error.html", 404, title="not found", message=str(exc))
        except StoreClosedError:
            return self._page("error.html", 503, title="store closed", message=(
                "The lineage store is closed: the run that served it has ended."))
        except RayorchError as exc:
            return self._page("error.html", 503, title="store unavailable", message=str(exc))
        except Exception as exc:  # never a traceback to the browser
            print(f"rayorch ui: {type(exc).__name__}: {exc}", file=sys.stderr)
            return self._page("error.html", 500, title="error", message=(
                "This page could not be built; the server's log says why."))

    async def index(self, request: Request) -> Response:
        return await self._serve("runs.html", lambda: pages.runs_page(
            self.runs, request.query_params.get("page")))

    async def run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        return await self._serve("run.html", lambda: pages.run_page(self.runs, run_id))

    async def sources(self, request: Request) -> Response:
        run_id, q = request.path_params["run_id"], request.query_params
        return await self._serve("sources.html", lambda: pages.sources_page(
            self.runs, run_id, q.get("page"), q.get("only")))

    async def entity(self, request: Request) -> Response:
        run_id, q = request.path_params["run_id"], request.query_params
        text = request.path_params["entity"]

        def build() -> dict[str, Any]:
            return pages.entity_page(self.runs, run_id, parse_path(text), q.get("page"))

        return await self._serve("entity.html", build)

    async def failures(self, request: Request) -> Response:
        run_id, key = request.path_params["run_id"], request.path_params["key"]
        return await self._serve("failures.html", lambda: pages.failures_page(
            self.runs, run_id, key, request.query_params.get("page")))

    async def timeline(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        return await self._serve("timeline.html", lambda: pages.timeline_page(self.runs, run_id))

    async def audit(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        again = request.query_params.get("again") == "1"
        return await self._serve("audit.html", lambda: pages.audit_page(self.runs, run_id,
                                                                         again))

    async def page(self, request: Request) -> Response:
        run_id, text = request.path_params["run_id"], request.path_params["entity"]
        return await self._serve("page.html", lambda: pages.page_page(
            self.runs, run_id, _page_path(text)))

    async def page_image(self, request: Request) -> Response:
        """The page rendered from its source (404 with why when it cannot be)."""
        run_id, text = request.path_params["run_id"], request.path_params["entity"]

        def build() -> Response:
            path = _page_path(text)
            view = pages.page_page(self.runs, run_id, path)["view"]
            try:
                return Response(self.images.png(view.source, path[1]),
                                media_type="image/png")
            except LookupError as exc:
                return Response(f"{exc}\n", status_code=404, media_type="text/plain")

        return await run_in_threadpool(self._guarded, build)

    async def region_image(self, request: Request) -> Response:
        """A region's image (a figure's crop) as its Grain committed it."""
        p = request.path_params

        def build() -> Response:
            png = pages.region_png(self.runs, p["run_id"], _page_path(p["entity"]), p["order"])
            if png is None:
                return Response("no image for this region\n", status_code=404,
                                media_type="text/plain")
            return Response(png, media_type="image/png")

        return await run_in_threadpool(self._guarded, build)

    def _guarded(self, build: Callable[[], Response]) -> Response:
        """A non-HTML response; errors as plain text (never a traceback)."""
        try:
            return build()
        except (RunNotFoundError, InvalidRunIdError, PageNotFound, InvalidPathError) as exc:
            return Response(f"{exc}\n", status_code=404, media_type="text/plain")
        except RayorchError as exc:
            return Response(f"{exc}\n", status_code=503, media_type="text/plain")

    async def metrics(self, request: Request) -> Response:
        """The store's runs for Prometheus (rayorch/ui/metrics.py)."""
        from rayorch.ui.metrics import CONTENT_TYPE, store_metrics

        try:
            body = await run_in_threadpool(store_metrics, self.runs)
        except ImportError:
            return Response("/metrics needs prometheus-client: pip install "
                            "'rayorch[metrics]'\n", status_code=501, media_type="text/plain")
        except RayorchError as exc:
            return Response(f"store unavailable: {exc}\n", status_code=503,
                            media_type="text/plain")
        return Response(body, media_type=CONTENT_TYPE)

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return self._page("error.html", 404, title="not found",
                          message=f"There is no page at {request.url.path}.")

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        return self._page("error.html", 405, title="read-only",
                          message="This web view is read-only: only GET requests.")


def _page_path(text: str) -> tuple[int, int]:
    """``SOURCE.PAGE`` (a page entity) as a path; ``PageNotFound`` for anything else."""
    path = parse_path(text)
    if len(path) != 2:
        raise PageNotFound(f"{format_path(path)} is not a page: give SOURCE.PAGE, e.g. 3.0")
    return path[0], path[1]


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())


def _bearer(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:] if auth.lower().startswith("bearer ") else None


def _with_headers(app: ASGIApp, set_cookie: bool, token: str) -> ASGIApp:
    """``app`` with the security headers on every response (and the token cookie)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += SECURITY_HEADERS
                if set_cookie:
                    headers.append((b"set-cookie", (
                        f"{TOKEN_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/").encode()))
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_with)

    return wrapped


def build_app(store: LineageStore, *, token: str | None = None) -> UiApp:
    """The ASGI app of the web view over ``store`` (see the module docstring)."""
    return UiApp(store, token=token)


__all__ = ["TOKEN_COOKIE", "UiApp", "build_app"]
