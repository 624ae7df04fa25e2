"""Lineage store backends by URL scheme, and :func:`open_store`.

A backend is one module holding a class (or a function) that opens a store from its URL,
and one :class:`Backend` line in ``BACKENDS`` (or a :func:`register_backend` call). The
registry names a backend by its import path and imports it on first use, so neither the
interfaces (:mod:`rayorch.store.base`) nor this module import any backend, and a
``memory://`` store never imports redis.

Example::

    register_backend("postgres", "mypkg.pg_store:PostgresStore", shared=True)
    store = open_store("postgres://db/rayorch")
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rayorch.core.errors import MissingExtraError
from rayorch.store.errors import StoreURLError

if TYPE_CHECKING:
    from rayorch.store.base import LineageStore


@dataclass(frozen=True)
class Backend:
    """``opener`` is ``"module:attribute"`` (dots after the colon reach into a class).

    ``shared``: several processes reach the same runs through the URL (a run on it can be
    resumed, joined by more drivers and audited from elsewhere).
    """

    scheme: str
    opener: str
    shared: bool
    extra: str | None = None  # the rayorch extra that installs its client library

    def open(self, url: str) -> LineageStore:
        module, _, attribute = self.opener.partition(":")
        try:
            target: Any = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if self.extra is None or (exc.name or "").startswith("rayorch"):
                raise
            raise MissingExtraError(f"a {self.scheme}:// lineage store", f"the {exc.name} client",
                                    self.extra) from exc
        for name in attribute.split("."):
            target = getattr(target, name)
        store: LineageStore = target(url)
        return store


BACKENDS: dict[str, Backend] = {}


def register_backend(scheme: str, opener: str, *, shared: bool, extra: str | None = None
                     ) -> None:
    """Open URLs ``<scheme>://...`` with ``opener`` (``"module:attribute"``, imported lazily);
    ``extra``: the rayorch extra to name when its client library is missing."""
    BACKENDS[scheme.lower()] = Backend(scheme.lower(), opener, shared, extra)


register_backend("memory", "rayorch.store.memory:MemoryStore.open", shared=False)
for _scheme in ("redis", "rediss"):
    register_backend(_scheme, "rayorch.store.redis_store:RedisStore", shared=True,
                     extra="redis")
for _scheme in ("redis+cluster", "rediss+cluster"):
    register_backend(_scheme, "rayorch.store.redis_cluster:RedisClusterStore", shared=True,
                     extra="redis")


def redact_url(url: str) -> str:
    """The URL without its password (for messages and logs); also with several hosts."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user, colon, _ = userinfo.partition(":")
    if not at or not colon:
        return url
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hosts}"))


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_shared_store(url: str) -> bool:
    """Whether the URL names a store that several processes share (see :class:`Backend`)."""
    backend = BACKENDS.get(scheme_of(url))
    return backend is not None and backend.shared


def with_archive(url: str, archive: str | None) -> str:
    """The store URL with ``archive=`` set (``--archive URL``); ``url`` itself without one.

    Only a shared store keeps facts to archive: a ``memory://`` store ends with its process.
    """
    if not archive:
        return url
    if not is_shared_store(url):
        raise StoreURLError(redact_url(url), "--archive needs a shared store (--store "
                            "redis://...): a memory:// store keeps nothing to archive")
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k != "archive"]
    return urlunsplit(parts._replace(query=urlencode([*query, ("archive", archive)])))


def add_archive_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--archive URL``: finished lineage goes there (``archive=`` on the store URL)."""
    parser.add_argument("--archive", metavar="URL", default=None,
                        help="archive each finished shard's facts as compressed segments in "
                        "this directory or object store URL (s3://bucket/prefix), then trim "
                        "them from the store; every reader finds them there")


def open_store(url: str = "memory://") -> LineageStore:
    """Open a lineage store by URL: ``memory://[name]``, ``redis://...``, ``rediss://...``,
    or a Redis Cluster: ``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://``).

    ``redis://user:password@host:6379/0?payload_dir=/data/payloads&payload_threshold=128``
    """
    scheme = scheme_of(url)
    backend = BACKENDS.get(scheme)
    if backend is None:
        known = ", ".join(f"{s}://" for s in sorted(BACKENDS))
        raise StoreURLError(url, f"unknown scheme {scheme or '(none)'!r} (known: {known})")
    return backend.open(url)


__all__ = ["BACKENDS", "Backend", "add_archive_option", "is_shared_store", "open_store",
           "redact_url", "register_backend", "scheme_of", "with_archive"]
