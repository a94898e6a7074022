"""The reference paged radix cache: a prefix tree of whole pages that emits events by the contract
(schemas/README.md, "What the reference cache emits").

Keys are packed uint32 pages (compared as bytes, never token by token); root children are keyed
by (namespace, first page), deeper children by first page (a subtree has one namespace). Each node
keeps its storage digests, and event digests only when its namespace is not the default (the
chains coincide otherwise). LRU is a monotonic counter with a lazy heap of leaf candidates.
Plain synchronous code: one thread drives a cache, as an engine's scheduler does; events queue
up (coalesced) until `take_events()` / `flush_events()`, once per engine step.
"""

from __future__ import annotations

from collections import Counter
from heapq import heapify, heappop, heappush
from typing import Any, Callable, Sequence

from kvevents.cache.match import Match, NodeInfo
from kvevents.cache.node import (
    DIGEST,
    Node,
    as_namespace,
    check_count,
    check_opt_str,
    digests,
    hexes,
    published,
    published_one,
    tokens_of,
)
from kvevents.cache.queue import EventQueue
from kvevents.cache.store import PageStore
from kvevents.cache.tier import PageContent, StorageTier
from kvevents.events import BlockRemoved, BlockStored, Event, event_to_dict
from kvevents.hashing import Namespace, check_page_size, event_seed, pack_tokens, storage_seed

__all__ = ["RadixCache", "Match", "NodeInfo"]


class RadixCache:
    """Paged prefix cache whose events follow "What the reference cache emits" exactly (see module docstring)."""

    def __init__(
        self,
        page_size: int,
        *,
        medium: str = "GPU",
        capacity_pages: int | None = None,
        store: PageStore | None = None,
        storage_events: bool = False,
        on_events: Callable[[list[Event]], Any] | None = None,
        page_content: PageContent | None = None,
    ) -> None:
        check_page_size(page_size)
        if capacity_pages is not None:
            check_count(capacity_pages, "capacity_pages")
        check_opt_str(medium, "medium")
        if on_events is not None and not callable(on_events):
            raise ValueError("on_events must be callable or None")
        if page_content is not None and not callable(page_content):
            raise ValueError("page_content must be callable or None")
        self.page_size = page_size
        self.medium = medium
        self.capacity_pages = capacity_pages
        self.on_events = on_events
        self.page_content = page_content
        self._step = page_size * 4
        self._queue = EventQueue()
        self._tier = StorageTier(store, page_size, self._queue, events=storage_events) if store is not None else None
        self._seeds: dict[Namespace, tuple[bytes | None, bytes | None]] = {}
        self._tick = 0
        self._serial = 0
        self._gen = 0
        self.reset()

    # ------------------------------------------------------------------ state
    @property
    def store(self) -> PageStore | None:
        return self._tier.store if self._tier is not None else None

    @property
    def num_pages(self) -> int:
        """Live device pages in the tree."""
        return self._num_pages

    @property
    def num_nodes(self) -> int:
        return self._num_nodes

    def reset(self) -> None:
        """Drop the whole tree and all locks; queue `AllBlocksCleared` after pending events."""
        root = Node()
        root.lock = 1  # never a candidate
        self._root = root
        self._num_pages = 0
        self._num_nodes = 0
        self._heap: list[tuple[int, int, Node]] = []
        self._gen += 1
        self._queue.clear_all()
        if self._tier is not None:
            self._tier.reset()

    def _seed(self, ns: Namespace) -> tuple[bytes | None, bytes | None]:
        s = self._seeds.get(ns)
        if s is None:
            sh, eh = storage_seed(ns), event_seed(ns)
            s = (bytes.fromhex(sh) if sh else None, bytes.fromhex(eh) if eh else None)
            if len(self._seeds) < 4096:
                self._seeds[ns] = s
        return s

    def _pack(self, token_ids: Sequence[int]) -> bytes:
        data = pack_tokens(token_ids)
        step = self._step
        extra = len(data) % step
        return data[: len(data) - extra] if extra else data

    # ------------------------------------------------------------------ walk
    def _touch(self, node: Node) -> None:
        self._tick += 1
        node.last_access = self._tick
        if not node.children and not node.lock:
            heap = self._heap
            heappush(heap, (self._tick, node.serial, node))
            if len(heap) > 4 * self._num_nodes + 1024:  # stale entries: bound memory without evictions
                self._rebuild_heap()

    def _split(self, node: Node, nbytes: int) -> Node:
        """Cut `node` after `nbytes`: a new node (the prefix) takes its place, `node` keeps the rest."""
        k = nbytes // self._step
        parent = node.parent
        assert parent is not None
        self._serial += 1
        head = Node(self._serial)
        head.parent = parent
        head.ns = node.ns
        head.lora_name = node.lora_name
        head.lock = node.lock
        head.data = node.data[:nbytes]
        node.data = node.data[nbytes:]
        cut = k * DIGEST
        head.storage = node.storage[:cut]
        node.storage = node.storage[cut:]
        if node.events is not None:
            head.events = node.events[:cut]
            node.events = node.events[cut:]
        if node.content is not None:
            head.content = node.content[:k]
            node.content = node.content[k:]
        key = (head.ns, head.data[: self._step]) if parent is self._root else head.data[: self._step]
        parent.children[key] = head
        head.children[node.data[: self._step]] = node
        node.parent = head
        self._num_nodes += 1
        # "What the reference cache emits", LRU: `node` was refreshed just before the split and, as the lower (deeper) half, keeps
        # this access's time; the upper half (`head`, the prefix, now its parent) takes the next tick.
        self._tick += 1
        head.last_access = self._tick
        return head

    def _walk(self, data: bytes, ns: Namespace) -> tuple[Node, int, list[Node]]:
        """Follow `data` from the root, refreshing and splitting; (deepest node, bytes matched, path)."""
        step = self._step
        n = len(data)
        node = self._root
        path: list[Node] = []
        off = 0
        child = node.children.get((ns, data[:step]))
        while child is not None:
            cd = child.data
            ln = len(cd)
            self._touch(child)
            if data[off : off + ln] == cd:
                off += ln
                node = child
                path.append(child)
                if off == n:
                    break
                child = node.children.get(data[off : off + step])
                continue
            # first page matches (it is the key): binary search the common whole pages
            lo, hi = 1, min(ln, n - off) // step
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if data[off : off + mid * step] == cd[: mid * step]:
                    lo = mid
                else:
                    hi = mid - 1
            node = self._split(child, lo * step)
            path.append(node)
            off += lo * step
            break
        return node, off, path

    # ------------------------------------------------------------------ public API
    def match_prefix(self, token_ids: Sequence[int], namespace: Namespace | None = None) -> Match:
        """Longest cached whole-page prefix; refreshes its path and splits a node the match ends in."""
        ns = as_namespace(namespace)
        data = self._pack(token_ids)
        if not data:
            return Match(0, b"", b"", [], self._root, self, self._gen)
        node, off, path = self._walk(data, ns)
        if len(path) == 1:
            storage = path[0].storage
            events = path[0].ev()
        else:
            storage = b"".join([p.storage for p in path])
            events = storage if ns.is_default else b"".join([p.ev() for p in path])
        content = [c for p in path for c in p.content] if self.page_content is not None else []  # type: ignore[union-attr]
        return Match(off // 4, storage, events, content, node, self, self._gen)

    def insert(
        self,
        token_ids: Sequence[int],
        namespace: Namespace | None = None,
        *,
        lora_name: str | None = None,
        session_id: str | None = None,
    ) -> int:
        """Cache the whole pages of `token_ids`; returns how many tokens were already cached."""
        ns = as_namespace(namespace)
        check_opt_str(lora_name, "lora_name")
        check_opt_str(session_id, "session_id")
        data = self._pack(token_ids)
        if not data:
            return 0
        node, off, _ = self._walk(data, ns)
        n = len(data)
        if off == n:
            return off // 4
        step = self._step
        cap = self.capacity_pages
        if cap is not None:
            need = (n - off) // step
            if self._num_pages + need > cap:
                self._pin(node, 1)
                try:
                    self._evict(self._num_pages + need - cap)
                finally:
                    self._pin(node, -1)
                room = cap - self._num_pages
                if room <= 0:
                    return off // 4
                if room < need:
                    n = off + room * step
                    data = data[:n]
        self._add_leaf(node, data, off, ns, lora_name, session_id)
        return off // 4

    def _add_leaf(
        self, parent: Node, data: bytes, off: int, ns: Namespace, lora_name: str | None, session_id: str | None
    ) -> None:
        step = self._step
        tail = data[off:]
        if parent is self._root:
            sprior, eprior = self._seed(ns)
            parent_ev: bytes | None = None
            key: Any = (ns, tail[:step])
        else:
            sprior = parent.storage[-DIGEST:]
            parent_ev = eprior = parent.ev()[-DIGEST:]
            key = tail[:step]
        self._serial += 1
        leaf = Node(self._serial)
        leaf.parent = parent
        leaf.ns = ns
        leaf.lora_name = lora_name
        leaf.data = tail
        leaf.storage = digests(tail, step, sprior)
        if not ns.is_default:
            leaf.events = digests(tail, step, eprior)
        if self.page_content is not None:
            leaf.content = list(self.page_content(ns, data, self.page_size)[off // step :])
        parent.children[key] = leaf
        self._num_pages += len(tail) // step
        self._num_nodes += 1
        self._touch(leaf)
        evs = leaf.ev()
        tokens = tokens_of(tail)
        self._queue.push(
            BlockStored(
                published(evs),
                None if parent_ev is None else published_one(parent_ev),
                tokens,
                self.page_size,
                None,
                self.medium,
                lora_name,
                cache_salt=ns.cache_salt,
                session_id=session_id,
            )
        )
        if self._tier is not None:
            contents = (
                leaf.content if leaf.content is not None else [tail[i : i + step] for i in range(0, len(tail), step)]
            )
            self._tier.write_through(leaf.storage, evs, contents, parent_ev, tokens, ns, lora_name, session_id)

    def _pin(self, node: Node, delta: int) -> None:
        root = self._root
        while node is not root and node is not None:
            node.lock += delta
            if node.lock == 0 and not node.children:
                heappush(self._heap, (node.last_access, node.serial, node))
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_pages: int) -> int:
        """Free at least `num_pages` pages (LRU leaves first) unless nothing is evictable; pages freed."""
        check_count(num_pages, "num_pages")
        return self._evict(num_pages)

    def _evict(self, num_pages: int) -> int:
        heap = self._heap
        if len(heap) > 4 * self._num_nodes + 1024:
            self._rebuild_heap()
            heap = self._heap
        freed = 0
        root = self._root
        while freed < num_pages and heap:
            t, _, node = heappop(heap)
            if not node.alive or node.children or node.lock or node.last_access != t:
                continue
            parent = node.parent
            assert parent is not None
            key = (node.ns, node.data[: self._step]) if parent is root else node.data[: self._step]
            del parent.children[key]
            node.alive = False
            npages = len(node.storage) // DIGEST
            freed += npages
            self._num_pages -= npages
            self._num_nodes -= 1
            self._queue.push(BlockRemoved(published(node.ev()), self.medium, node.lora_name))
            if parent is not root and not parent.children and not parent.lock:
                heappush(heap, (parent.last_access, parent.serial, parent))
        return freed

    def _rebuild_heap(self) -> None:
        heap = [(n.last_access, n.serial, n) for n in self._nodes() if not n.children and not n.lock]
        heapify(heap)
        self._heap = heap

    def _check_match(self, match: Match, what: str) -> None:
        if not isinstance(match, Match):
            raise ValueError(f"{what}() needs a Match, got {type(match).__name__}")
        if match.cache is not self:
            raise ValueError(f"{what}(): the match belongs to another cache")
        if match.generation != self._gen:
            raise ValueError(f"{what}(): the match was taken before a reset(); its nodes are gone")

    def lock(self, match: Match) -> None:
        """Pin exactly the matched nodes (and so their ancestors) against eviction."""
        self._check_match(match, "lock")
        if not match.node.alive:
            raise ValueError("lock(): the matched pages were evicted since the match")
        match.count_lock(1)
        self._pin(match.node, 1)

    def unlock(self, match: Match) -> None:
        """Undo one `lock(match)`; a match that is not locked is a ValueError."""
        self._check_match(match, "unlock")
        match.count_lock(-1)  # ValueError (nothing changed) if it is not locked
        self._pin(match.node, -1)

    # ------------------------------------------------------------------ events
    def take_events(self) -> list[Event]:
        """Drain the coalesced event queue."""
        return self._queue.take()

    def flush_events(self) -> int:
        """take_events() and hand the list to `on_events` (not called when it is empty).

        Returns the number of events taken. Call it once per engine step.
        """
        evs = self._queue.take()
        if evs and self.on_events is not None:
            self.on_events(evs)
        return len(evs)

    def pending_events(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ views
    def _nodes(self) -> list[Node]:
        out: list[Node] = []
        stack = list(self._root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def published_copies(self) -> Counter[int]:
        """Published int64 hash -> live copies in the tree (same tokens under two extra keys: 2)."""
        c: Counter[int] = Counter()
        for n in self._nodes():
            c.update(published(n.ev()))
        return c

    def sequences(self) -> list[NodeInfo]:
        """Every live node: namespace, full token path, its own pages' hashes, lock, access time."""
        out = []
        for n in self._nodes():
            parts = []
            p: Node | None = n
            while p is not None and p is not self._root:
                parts.append(p.data)
                p = p.parent
            out.append(
                NodeInfo(
                    n.ns,
                    tokens_of(b"".join(reversed(parts))),
                    hexes(n.storage),
                    hexes(n.ev()),
                    n.lock,
                    n.last_access,
                    not n.children,
                )
            )
        return out

    def debug_dump(self) -> dict[str, Any]:
        """A structural dump of the whole state (tree, times, locks, queue) for equality checks."""

        def dump(n: Node) -> tuple[Any, ...]:
            kids = sorted((dump(c) for c in n.children.values()), key=repr)
            return (n.ns, n.data, n.storage, n.ev(), n.last_access, n.lock, tuple(kids))

        return {
            "tree": dump(self._root),
            "tick": self._tick,
            "gen": self._gen,
            "num_pages": self._num_pages,
            "num_nodes": self._num_nodes,
            "queue": [event_to_dict(e) for e in self._queue.peek()],
        }

    # ------------------------------------------------------------------ storage tier
    def _need_tier(self, what: str) -> StorageTier:
        if self._tier is None:
            raise ValueError(f"{what}() needs a cache built with store=...")
        return self._tier

    def storage_hit_length(
        self, token_ids: Sequence[int], namespace: Namespace | None, prior: str | None = None
    ) -> int:
        """Tokens the store holds for this sequence, from `prior` or the namespace's own seed."""
        ns = as_namespace(namespace)
        if self._tier is None:
            pack_tokens(token_ids)
            return 0
        tier = self._tier
        return tier.hit_pages(tier.keys_for(token_ids, ns, prior)) * self.page_size

    def prefetch_pages(
        self, token_ids: Sequence[int], namespace: Namespace | None, prior: str | None = None
    ) -> list[bytes]:
        """Read (and verify) the leading stored pages of this sequence; stops at the first miss."""
        ns = as_namespace(namespace)
        tier = self._need_tier("prefetch_pages")
        return tier.read(tier.keys_for(token_ids, ns, prior))

    def prefetch(self, token_ids: Sequence[int], namespace: Namespace | None, prior: str | None = None) -> int:
        """Tokens loaded from storage for this sequence (see `prefetch_pages`); 0 without a store."""
        ns = as_namespace(namespace)
        if self._tier is None:
            pack_tokens(token_ids)
            return 0
        return len(self.prefetch_pages(token_ids, ns, prior)) * self.page_size

    def offload(
        self,
        token_ids: Sequence[int],
        namespace: Namespace | None,
        prior: str | None = None,
        contents: Sequence[bytes] | None = None,
    ) -> list[str]:
        """Write whole pages to the store continuing at `prior` (chunked offload); their storage keys."""
        ns = as_namespace(namespace)
        return self._need_tier("offload").offload(token_ids, ns, prior, contents)

    def storage_remove(self, token_ids: Sequence[int], namespace: Namespace | None) -> int:
        """Delete a sequence's stored pages; STORAGE BlockRemoved when storage events are on."""
        ns = as_namespace(namespace)
        return self._need_tier("storage_remove").remove(token_ids, ns)
