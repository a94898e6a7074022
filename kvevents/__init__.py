"""kvevents: the KV-event contract (hashing, wire schema), a reference cache, transport and tools."""

from kvevents.errors import DecodeError, KVEventsError
from kvevents.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from kvevents.hashing import (
    Namespace,
    event_hashes,
    event_hashes_int64,
    event_seed,
    hash_chains,
    page_hashes,
    storage_hashes,
    storage_seed,
    to_int64,
)

__version__ = "0.1.0"

__all__ = [
    "Namespace",
    "page_hashes",
    "storage_seed",
    "event_seed",
    "storage_hashes",
    "event_hashes",
    "event_hashes_int64",
    "hash_chains",
    "to_int64",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "Event",
    "KVEventBatch",
    "encode_batch",
    "decode_batch",
    "DecodeError",
    "KVEventsError",
    "__version__",
]
