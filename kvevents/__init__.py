"""kvevents: the KV-event contract (hashing, wire schema), a reference cache, transport and tools.

| file | what it owns |
|---|---|
| `__main__.py` |  |
| `_chain.py` | The page chain's speed plumbing behind kvevents.hashing (private: hashing.py states the contract). |
| `errors.py` | The few named error types of kvevents; library code raises them, the CLI turns them into exit codes. |
| `events.py` | Event structs, the wire encoder and a tolerant decoder (schemas/README.md, "Wire format"). |
| `feed.py` | What any transport hands a consumer: Delivery and Reset in per-(source, dp_rank) seq order, per-source status, |
| `hashing.py` | The page-hash contract (schemas/README.md, sections "Namespace" to "The published integer"): namespaces, stora |
| `publisher.py` | Deprecated path, kept for one release: the publisher lives in `kvevents.zeromq.publisher`. |
| `relay.py` | `kvevents relay`: kvevents' publisher beside an engine that cannot load it (vLLM 0.33, or any engine speaking  |
| `subscriber.py` | Deprecated path, kept for one release: the subscriber lives in `kvevents.zeromq.subscriber`. |
| `wire_values.py` | Raw msgpack values as the tolerant decoder reads them (schemas/README.md, "What a decoder must accept"). |
| folders | one job each, listed with their module maps in README.md, "Layout and docs" |
"""

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
