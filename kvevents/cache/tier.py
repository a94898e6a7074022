"""The storage tier behind a RadixCache: write-through of new pages, hit length, prefetch.

Write-through (every page a device insert creates is written to the store at once) rather than
write-back on eviction, because: a crash or `reset()` of the device cache then loses nothing the
store should have (the sim's `restart()` models exactly that), the store's contents do not depend
on eviction timing (deterministic tests), and eviction stays a pure, cheap device operation.
The cost is one store write per new page, skipped when the key is already stored.
"""

from __future__ import annotations

from array import array
from typing import Callable, Sequence

from kvevents.cache.node import DIGEST, hexes, published, published_one
from kvevents.cache.queue import EventQueue
from kvevents.cache.store import PageStore
from kvevents.events import BlockRemoved, BlockStored
from kvevents.hashing import Namespace, pack_tokens, storage_hashes

__all__ = ["StorageTier", "STORAGE_MEDIUM", "PageContent"]

STORAGE_MEDIUM = "STORAGE"

# (namespace, packed uint32 tokens of whole pages from the root, page_size) -> one bytes per page.
PageContent = Callable[[Namespace, bytes, int], list[bytes]]


def _whole_pages(token_ids: Sequence[int], page_size: int) -> array[int]:
    data = pack_tokens(token_ids)
    step = page_size * 4
    arr = array("I")
    arr.frombytes(data[: len(data) // step * step])
    return arr


class StorageTier:
    """Pages in a `PageStore` keyed by storage hash, with optional STORAGE-medium events."""

    def __init__(self, store: PageStore, page_size: int, queue: EventQueue, *, events: bool = False) -> None:
        for name in ("get", "put", "contains", "delete"):
            if not callable(getattr(store, name, None)):
                raise ValueError(f"store must implement PageStore (missing {name}()), got {type(store).__name__}")
        self.store = store
        self.page_size = page_size
        self._queue = queue
        self.events = events
        # storage key -> published int64 of the pages this cache announced (STORAGE BlockStored)
        # since its last reset: AllBlocksCleared makes consumers forget every medium, so after a
        # reset a page already in the store is announced again the next time an insert writes it.
        self.announced: dict[str, int] = {}
        self.announced_lora: dict[str, str] = {}  # storage key -> lora_name, for pages announced under one

    def reset(self) -> None:
        """The cache queued AllBlocksCleared: nothing is announced any more."""
        self.announced.clear()
        self.announced_lora.clear()

    # ------------------------------------------------------------- writes
    def write_through(
        self,
        storage: bytes,
        events: bytes,
        contents: Sequence[bytes],
        parent_event: bytes | None,
        tokens: list[int],
        ns: Namespace,
        lora_name: str | None,
        session_id: str | None,
    ) -> int:
        """Write the pages not yet stored; the number written.

        With storage events, a STORAGE BlockStored per contiguous run of pages not announced since
        the last reset. `storage` and `events` are the new pages' packed 32-byte digests.
        """
        store = self.store
        written = 0
        run: list[int] = []
        announced = self.announced
        pub = published(events) if self.events else []
        for i, key in enumerate(hexes(storage)):
            if not store.contains(key):
                store.put(key, contents[i])
                written += 1
            if self.events and key not in announced:
                announced[key] = pub[i]
                if lora_name is not None:
                    self.announced_lora[key] = lora_name
                run.append(i)
            elif run:
                self._stored_run(run, events, parent_event, tokens, ns, lora_name, session_id)
                run = []
        if run:
            self._stored_run(run, events, parent_event, tokens, ns, lora_name, session_id)
        return written

    def _stored_run(
        self,
        run: list[int],
        events: bytes,
        parent_event: bytes | None,
        tokens: list[int],
        ns: Namespace,
        lora_name: str | None,
        session_id: str | None,
    ) -> None:
        ps = self.page_size
        first = run[0]
        prev = events[(first - 1) * DIGEST :] if first > 0 else parent_event
        pub = published(events)
        self._queue.push(
            BlockStored(
                [pub[i] for i in run],
                None if prev is None else published_one(prev),
                tokens[first * ps : (run[-1] + 1) * ps],
                ps,
                None,
                STORAGE_MEDIUM,
                lora_name,
                cache_salt=ns.cache_salt,
                session_id=session_id,
            )
        )

    def offload(
        self,
        token_ids: Sequence[int],
        namespace: Namespace,
        prior: str | None = None,
        contents: Sequence[bytes] | None = None,
    ) -> list[str]:
        """Write whole pages continuing the storage chain at `prior` (or the namespace seed)."""
        arr = _whole_pages(token_ids, self.page_size)
        keys = storage_hashes(arr, self.page_size, namespace, prior)
        if contents is None:
            raw = arr.tobytes()
            step = self.page_size * 4
            contents = [raw[i * step : (i + 1) * step] for i in range(len(keys))]
        elif len(contents) != len(keys):
            raise ValueError(f"offload got {len(contents)} page contents for {len(keys)} whole pages")
        for key, data in zip(keys, contents):
            if not self.store.contains(key):
                self.store.put(key, data)
        return keys

    def remove(self, token_ids: Sequence[int], namespace: Namespace) -> int:
        """Delete a sequence's pages (from the root) from the store; the number deleted.

        With storage events, a STORAGE BlockRemoved lists the deleted pages that were announced (one
        per run of pages announced under the same lora_name).
        """
        arr = _whole_pages(token_ids, self.page_size)
        keys = storage_hashes(arr, self.page_size, namespace)
        count = 0
        for key in keys:
            if self.store.delete(key):
                count += 1
            if key in self.announced:  # one event per page: the queue joins runs of one lora_name
                lora = self.announced_lora.pop(key, None)
                self._queue.push(BlockRemoved([self.announced.pop(key)], STORAGE_MEDIUM, lora))
        return count

    # ------------------------------------------------------------- reads
    def keys_for(self, token_ids: Sequence[int], namespace: Namespace, prior: str | None) -> list[str]:
        """Storage keys of the whole pages, continuing at `prior` or seeded by `namespace`."""
        return storage_hashes(_whole_pages(token_ids, self.page_size), self.page_size, namespace, prior)

    def hit_pages(self, keys: list[str]) -> int:
        """How many leading keys the store holds."""
        n = 0
        contains = self.store.contains
        for key in keys:
            if not contains(key):
                break
            n += 1
        return n

    def read(self, keys: list[str]) -> list[bytes]:
        """Read leading pages until the first miss (a corrupt page is a miss)."""
        out: list[bytes] = []
        get = self.store.get
        for key in keys:
            data = get(key)
            if data is None:
                break
            out.append(data)
        return out
