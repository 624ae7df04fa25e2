"""Every record rayorch keeps besides user values, with its codec, in one place: what an
archive reader (or any other reader of a run) decodes.

* :mod:`.facts` — the lineage facts (``encode_fact``, ``decode_fact``; the types are
  :mod:`rayorch.core.facts`);
* :mod:`.manifest` — the run manifest (``RunManifest``);
* :mod:`.pool_log` — the pool log (``PoolChange``, ``pool_changes``);
* :mod:`.sink` — a file sink's records and part names (``SinkRecord``, ``PartName``,
  ``record_of_line``).

Each is msgpack or JSON with a version, never pickle; each decoder treats its bytes as
untrusted and fails one record with a clear error.
"""

from rayorch.store.records.facts import decode_fact, encode_fact, fact_as_dict
from rayorch.store.records.manifest import MANIFEST_VERSION, ManifestError, RunManifest
from rayorch.store.records.pool_log import POOL_RECORD_VERSION, PoolChange, pool_changes
from rayorch.store.records.sink import (
           PartName,
           SinkError,
           SinkRecord,
           encode_record,
           record_of_line,
)

__all__ = ["MANIFEST_VERSION", "POOL_RECORD_VERSION", "ManifestError", "PartName", "PoolChange",
           "RunManifest", "SinkError", "SinkRecord", "decode_fact", "encode_fact", "encode_record",
           "fact_as_dict", "record_of_line", "pool_changes"]
