"""``rayorch ui --store URL [--host H] [--port P]``: serve the web view of a lineage store."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rayorch.core.errors import RayorchError
from rayorch.core.sanitize import sanitize


def add_ui_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "ui", help="serve a read-only web view of the runs: live progress, failures by "
        "cause, each document's lineage",
        description="Serve a read-only web view of a lineage store's runs. It listens on "
        "127.0.0.1 unless --host says otherwise; on any other host it requires the token "
        "it prints (the address it prints carries it).")
    parser.add_argument("--store", help="lineage store URL (default: $RAYORCH_STORE)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; another one needs "
                        "the printed token)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any)")
    parser.set_defaults(func=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    from rayorch.store import open_store
    from rayorch.store.registry import redact_url
    from rayorch.ui.server import UiServer

    url = args.store or os.environ.get("RAYORCH_STORE")
    if not url:
        raise RayorchError("no lineage store given: pass --store URL or set RAYORCH_STORE")
    if url.startswith("memory://"):
        raise RayorchError("a memory:// store lives in the process that runs it: serve it "
                           "from there with Pipeline.run(..., ui=True) or rayorch run ... --ui")
    store = open_store(url)
    store.check()
    server = UiServer(store, host=args.host, port=args.port)
    try:
        server.start()
        print(sanitize(f"rayorch ui: serving {redact_url(store.url)} at {server.url} "
                       "(Ctrl-C stops)"), file=sys.stderr, flush=True)
        if server.token:
            print(sanitize(f"rayorch ui: listening on {args.host}: every request needs the "
                           "token in that address"), file=sys.stderr, flush=True)
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        store.close()
    return 0


__all__ = ["add_ui_parser", "cmd_ui"]
