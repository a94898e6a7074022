"""The reference emitter: a paged radix cache with a storage tier (schemas/README.md: "Storage hashes", "What the reference cache emits", "Storage tier and prefetch")."""

from kvevents.cache.match import Match, NodeInfo
from kvevents.cache.radix import RadixCache
from kvevents.cache.store import FileStore, MemoryStore, PageStore
from kvevents.cache.tier import STORAGE_MEDIUM, PageContent

__all__ = ["RadixCache", "Match", "NodeInfo", "PageStore", "MemoryStore", "FileStore", "STORAGE_MEDIUM", "PageContent"]
