"""Errors of the lineage store, all :class:`~rayorch.core.errors.StoreError` subclasses.

Each error keeps its constructor arguments (so it pickles across Ray processes) and
builds a plain message saying what was wrong and what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rayorch.core.errors import StoreError
from rayorch.core.ids import GrainKey, format_grain


class _StoreErrorWithArgs(StoreError):
    """A StoreError whose message is built from its (picklable) constructor arguments."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), self.args)

    def __str__(self) -> str:
        return self.message()

    def message(self) -> str:  # pragma: no cover - every subclass overrides
        return repr(self.args)


class StoreURLError(_StoreErrorWithArgs):
    """The store URL cannot be used."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(url, reason)
        self.url, self.reason = url, reason

    def message(self) -> str:
        return (
            f"cannot open lineage store {self.url!r}: {self.reason}. "
            "Use memory://, memory://NAME, redis://[user:password@]host:port/db, rediss://... "
            "or redis+cluster://host:port[,host:port...]"
        )


class StoreUnavailableError(_StoreErrorWithArgs):
    """The store server cannot be reached (after retrying with backoff)."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(url, detail)
        self.url, self.detail = url, detail

    def message(self) -> str:
        return (
            f"cannot reach the lineage store at {self.url} ({self.detail}). "
            "Check that redis-server is running and the host/port in the URL are right."
        )


class StoreAuthError(_StoreErrorWithArgs):
    """The server refused the credentials (or needs some)."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(url, detail)
        self.url, self.detail = url, detail

    def message(self) -> str:
        return (
            f"the lineage store at {self.url} refused the login ({self.detail}). "
            "Put the right user and password in the URL: redis://USER:PASSWORD@host:port/db."
        )


class StoreTLSError(_StoreErrorWithArgs):
    """The TLS handshake with the store failed (an untrusted certificate, a non-TLS port)."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(url, detail)
        self.url, self.detail = url, detail

    def message(self) -> str:
        return (
            f"the TLS connection to the lineage store at {self.url} failed ({self.detail}). "
            "Give the server's CA with ?ssl_ca_certs=/path/ca.pem in the rediss:// URL, or "
            "check that the port speaks TLS."
        )


class StoreVersionError(_StoreErrorWithArgs):
    """The Redis server is too old for the store's streams and scripts."""

    def __init__(self, url: str, version: str) -> None:
        super().__init__(url, version)
        self.url, self.version = url, version

    def message(self) -> str:
        return (
            f"the lineage store at {self.url} runs Redis {self.version}; rayorch needs "
            "Redis 7.0 or newer. Upgrade the server or point the URL at another one."
        )


class RunNotFoundError(_StoreErrorWithArgs):
    """No run with this id exists in the store."""

    def __init__(self, run_id: str, url: str) -> None:
        super().__init__(run_id, url)
        self.run_id, self.url = run_id, url

    def message(self) -> str:
        return (
            f"run {self.run_id!r} not found in the lineage store {self.url}. "
            "Check the run id (`rayorch runs --store URL` lists them) and the --store URL."
        )


class StoreClosedError(StoreError):
    """A memory store was used after its last user closed it (its lineage was dropped)."""


class InvalidRunIdError(_StoreErrorWithArgs):
    """A run id has characters a store key cannot hold."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id

    def message(self) -> str:
        return (
            f"{self.run_id!r} is not a valid run id: use 1-128 letters, digits, '_', '.' "
            "or '-', starting with a letter, digit or '_' (not '.' or '..'; no ':', '/', "
            "braces or spaces)."
        )


class RunShapeError(_StoreErrorWithArgs, ValueError):
    """A run was opened with a shard count or micro-batch size below 1."""

    def __init__(self, shards: int, micro_batch: int) -> None:
        super().__init__(shards, micro_batch)
        self.shards, self.micro_batch = shards, micro_batch

    def message(self) -> str:
        return (
            f"a run needs shards >= 1 and micro_batch >= 1 (got shards={self.shards}, "
            f"micro_batch={self.micro_batch})."
        )


class RunMismatchError(_StoreErrorWithArgs):
    """A run was reopened with another plan fingerprint or shard configuration."""

    def __init__(self, run_id: str, what: str, stored: str, given: str) -> None:
        super().__init__(run_id, what, stored, given)
        self.run_id, self.what, self.stored, self.given = run_id, what, stored, given

    def message(self) -> str:
        return (
            f"run {self.run_id!r} was started with {self.what} {self.stored}, but it was reopened "
            f"with {self.what} {self.given}. Resume it with the same program and settings, or "
            "start a new run id."
        )


class UnknownRunPartError(_StoreErrorWithArgs):
    """A fact names a Call, Domain or shard the run's plan does not have."""

    def __init__(self, run_id: str, detail: str) -> None:
        super().__init__(run_id, detail)
        self.run_id, self.detail = run_id, detail

    def message(self) -> str:
        return f"run {self.run_id!r}: {self.detail}"


class FactNotAllowedError(_StoreErrorWithArgs):
    """A fact was given to the wrong store operation."""

    def __init__(self, tag: str, reason: str) -> None:
        super().__init__(tag, reason)
        self.tag, self.reason = tag, reason

    def message(self) -> str:
        return f"a {self.tag} fact cannot be appended here: {self.reason}"


class LeaseHeldError(_StoreErrorWithArgs):
    """Another driver holds the shard's lease."""

    def __init__(self, run_id: str, shard: int, holder: str, epoch: int) -> None:
        super().__init__(run_id, shard, holder, epoch)
        self.run_id, self.shard, self.holder, self.epoch = run_id, shard, holder, epoch

    def message(self) -> str:
        return (
            f"shard {self.shard} of run {self.run_id!r} is leased by driver {self.holder!r} "
            f"(epoch {self.epoch}); wait for its lease to expire or pick another shard."
        )


class LeaseLostError(_StoreErrorWithArgs):
    """The caller's lease expired or was released; it may not write to the shard."""

    def __init__(self, run_id: str, shard: int, epoch: int) -> None:
        super().__init__(run_id, shard, epoch)
        self.run_id, self.shard, self.epoch = run_id, shard, epoch

    def message(self) -> str:
        return (
            f"the lease of shard {self.shard} of run {self.run_id!r} (epoch {self.epoch}) has "
            "expired or was released; nothing was written. Acquire the lease again and "
            "rebuild the shard from the store before continuing."
        )


class FencedError(LeaseLostError):
    """Another driver holds or held the shard since the caller's epoch (the caller is deposed).

    ``holder`` is the driver that continued the shard (``""`` when the store does not
    know it) and ``current_epoch`` its epoch.
    """

    def __init__(self, run_id: str, shard: int, epoch: int, current_epoch: int,
                 holder: str = "") -> None:
        _StoreErrorWithArgs.__init__(self, run_id, shard, epoch, current_epoch, holder)
        self.run_id, self.shard, self.epoch = run_id, shard, epoch
        self.current_epoch, self.holder = current_epoch, holder

    def message(self) -> str:
        who = f"driver {self.holder!r}" if self.holder else "another driver"
        return (
            f"lease lost: run {self.run_id!r} shard {self.shard} was continued by {who} "
            f"(epoch {self.current_epoch}); this driver's epoch {self.epoch} is fenced off and "
            "nothing was written. Stop driving this shard."
        )


class LeaseRolledBackError(LeaseLostError):
    """The store has no record of the caller's epoch: it was restored from an older state.

    A Redis restart from an older RDB snapshot, or the promotion of an asynchronous
    replica, forgets leases (and facts) acknowledged after the snapshot.
    """

    def __init__(self, run_id: str, shard: int, epoch: int, last_epoch: int,
                 last_holder: str) -> None:
        _StoreErrorWithArgs.__init__(self, run_id, shard, epoch, last_epoch, last_holder)
        self.run_id, self.shard, self.epoch = run_id, shard, epoch
        self.last_epoch, self.last_holder = last_epoch, last_holder

    def message(self) -> str:
        last = (f"epoch {self.last_epoch} by driver {self.last_holder!r}" if self.last_holder
                else f"epoch {self.last_epoch}")
        return (
            f"lease lost: run {self.run_id!r} shard {self.shard} has no record of this driver's "
            f"epoch {self.epoch} (its last lease is {last}): the store was restored from an "
            "older state or failed over, so facts may be missing; nothing was written. Stop "
            "this driver and resume the run from the store."
        )


class GrainSealedError(_StoreErrorWithArgs):
    """Driver facts named Grains that are already sealed; nothing was written."""

    def __init__(self, run_id: str, shard: int, grains: Sequence[GrainKey]) -> None:
        grains = tuple((call, tuple(path)) for call, path in grains)
        super().__init__(run_id, shard, grains)
        self.run_id, self.shard, self.grains = run_id, shard, grains

    def message(self) -> str:
        names = ", ".join(format_grain(g) for g in self.grains)
        return (
            f"run {self.run_id!r} shard {self.shard}: {names} already sealed (committed or "
            "failed); nothing was written. Read the shard's facts from your cursor to catch up, "
            "then decide again."
        )


class StoreRolledBackError(_StoreErrorWithArgs):
    """The store no longer holds facts the appending driver built its state on; nothing was
    written.

    A Redis restarted from an AOF cut short by an OS crash (``appendfsync everysec`` loses
    up to its last second), from an older snapshot, or an asynchronous replica promoted,
    forgets facts it acknowledged. A driver whose lease survived would otherwise keep
    appending facts computed from the forgotten ones. ``detail`` says which were missing.
    """

    def __init__(self, run_id: str, shard: int, detail: str) -> None:
        super().__init__(run_id, shard, detail)
        self.run_id, self.shard, self.detail = run_id, shard, detail

    def message(self) -> str:
        return (
            f"the lineage store went back on run {self.run_id!r} shard {self.shard}: "
            f"{self.detail}, so it lost facts it had acknowledged (a rollback: restarted "
            "from an AOF cut short by a crash or an older snapshot, or a replica promoted); "
            "nothing was written. Rebuild the shard from what the store holds; outputs "
            "already in part files are adopted from them."
        )


class PayloadError(_StoreErrorWithArgs):
    """A durable payload could not be written or read."""

    def __init__(self, ref: str, detail: str) -> None:
        super().__init__(ref, detail)
        self.ref, self.detail = ref, detail

    def message(self) -> str:
        return (
            f"payload {self.ref!r}: {self.detail}. Check that the payload directory "
            "(payload_dir= in the store URL) is the same for every process of the run."
        )


class PayloadMissingError(PayloadError):
    """The object holding a payload is not there: freed once its source was delivered, or
    lost (the audit tells which)."""


__all__ = [
    "FactNotAllowedError",
    "FencedError",
    "GrainSealedError",
    "InvalidRunIdError",
    "LeaseHeldError",
    "LeaseLostError",
    "LeaseRolledBackError",
    "PayloadError",
    "PayloadMissingError",
    "RunMismatchError",
    "RunNotFoundError",
    "StoreAuthError",
    "StoreClosedError",
    "StoreError",
    "StoreRolledBackError",
    "StoreTLSError",
    "StoreURLError",
    "StoreUnavailableError",
    "StoreVersionError",
    "UnknownRunPartError",
]
