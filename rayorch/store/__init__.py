"""The lineage store: event-sourced facts of runs, in memory or in Redis Streams.

>>> from rayorch.store import open_store
>>> store = open_store("memory://")
"""

from rayorch.store.base import (
    AppendBasis,
    DriverRegistry,
    FactLog,
    LeaseHolder,
    Leases,
    LineageStore,
    RunInfo,
    RunRegistry,
    StoredFact,
    shard_of,
)
from rayorch.store.errors import (
    FactNotAllowedError,
    FencedError,
    GrainSealedError,
    InvalidRunIdError,
    LeaseHeldError,
    LeaseLostError,
    LeaseRolledBackError,
    PayloadError,
    RunMismatchError,
    RunNotFoundError,
    RunShapeError,
    StoreAuthError,
    StoreError,
    StoreRolledBackError,
    StoreUnavailableError,
    StoreURLError,
    StoreVersionError,
    UnknownRunPartError,
)
from rayorch.store.registry import open_store, register_backend

__all__ = [
    "AppendBasis",
    "DriverRegistry",
    "FactLog",
    "Leases",
    "RunRegistry",
    "FactNotAllowedError",
    "FencedError",
    "GrainSealedError",
    "InvalidRunIdError",
    "LeaseHeldError",
    "LeaseHolder",
    "LeaseLostError",
    "LeaseRolledBackError",
    "LineageStore",
    "PayloadError",
    "RunInfo",
    "RunMismatchError",
    "RunShapeError",
    "RunNotFoundError",
    "StoreAuthError",
    "StoreError",
    "StoreRolledBackError",
    "StoreURLError",
    "StoreUnavailableError",
    "StoreVersionError",
    "StoredFact",
    "UnknownRunPartError",
    "open_store",
    "register_backend",
    "shard_of",
]
