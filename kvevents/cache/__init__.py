"""The reference emitter: a paged radix cache with a storage tier (schemas/README.md: "Storage hashes", "What the reference cache emits", "Storage tier and prefetch").

| file | what it owns |
|---|---|
| `match.py` | What `match_prefix` returns (`Match`) and what `sequences()` reports per node (`NodeInfo`). |
| `node.py` | Radix node and the small helpers the cache is built from (digest chains, validation). |
| `queue.py` | The cache's event queue: coalesces each new event with the last queued one (schemas/README.md, "What the ... |
| `radix.py` | The reference paged radix cache: a prefix tree of whole pages that emits events by the contract ... |
| `store.py` | Page stores for the storage tier ("L3"), keyed by the storage hash (schemas/README.md, "Storage tier and ... |
| `tier.py` | The storage tier behind a RadixCache: write-through of new pages, hit length, prefetch. |
"""

from kvevents.cache.match import Match, NodeInfo
from kvevents.cache.radix import RadixCache
from kvevents.cache.store import FileStore, MemoryStore, PageStore
from kvevents.cache.tier import STORAGE_MEDIUM, PageContent

__all__ = ["RadixCache", "Match", "NodeInfo", "PageStore", "MemoryStore", "FileStore", "STORAGE_MEDIUM", "PageContent"]
