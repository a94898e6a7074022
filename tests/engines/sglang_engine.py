"""SGLang 0.5.20's own RadixCache on CPU, served requests the way its scheduler does, and the ground
truth read back from the radix tree (runs inside the SGLang venv; stand-ins: standins.TORCHVISION).

The truth is computed from the tree itself (each live node's tokens along its path, its extra_key
and cache_salt), hashed by kvevents' contract: never from what was published.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import standins

STANDINS = [standins.stub_torchvision()]

import torch  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

from kvevents.hashing import Namespace, event_hashes, to_int64  # noqa: E402

PAGE = 16
ADAPTERS = (None, "lora-a", "lora-b")  # SGLang namespaces an adapter's pages by extra_key
SALTS = (None, "tenant-1")


@dataclass(frozen=True)
class Request:
    tokens: list[int]
    extra_key: str | None
    salt: str | None


class SGLangEngine:
    """RadixCache (events on) over a paged KV pool of `pages` pages: small, so requests evict."""

    def __init__(self, pages: int = 48) -> None:
        kv = MHATokenToKVPool(
            size=pages * PAGE,
            page_size=PAGE,
            dtype=torch.float16,
            head_num=1,
            head_dim=8,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
            enable_alt_stream=False,
        )
        self.alloc = PagedTokenToKVPoolAllocator(pages * PAGE, PAGE, torch.float16, "cpu", kv, False)
        self.cache = RadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.alloc,
                page_size=PAGE,
                enable_kv_cache_events=True,
            )
        )
        self.evicted_tokens = 0
        self.hit_tokens = 0

    def key(self, req: Request) -> RadixKey:
        return RadixKey(list(req.tokens), req.extra_key, cache_salt=req.salt)

    def serve(self, req: Request) -> int:
        """One request: match, lock, allocate (evicting LRU leaves), insert, unlock; returns the hit."""
        key = self.key(req)
        aligned = len(req.tokens) // PAGE * PAGE
        m = self.cache.match_prefix(MatchPrefixParams(key=key))
        hit = len(m.device_indices)
        self.hit_tokens += hit
        node = m.last_device_node
        self.cache.inc_lock_ref(node)
        try:
            need = aligned - hit
            if need <= 0:
                return hit
            short = need - self.alloc.available_size()
            if short > 0:
                self.evicted_tokens += self.cache.evict(EvictParams(num_tokens=short)).num_tokens_evicted
            new = self.alloc.alloc(need)
            if new is None:  # everything left is locked: the scheduler would queue the request
                return hit
            values = torch.cat([m.device_indices.to(torch.int64), new.to(torch.int64)])
            res = self.cache.insert(InsertParams(key=key, value=values))
            if res.prefix_len > hit:  # pages another request inserted meanwhile: ours are duplicates
                self.alloc.free(values[hit : res.prefix_len])
            return hit
        finally:
            self.cache.dec_lock_ref(node)

    def flush(self) -> None:
        """The scheduler's flush_cache: the tree (AllBlocksCleared) and the KV pool."""
        self.cache.reset()
        self.alloc.clear()

    def take_events(self) -> list:
        return self.cache.take_events()

    def matched_pages(self, tokens: list[int], salt: str | None) -> int:
        """The longest cached page prefix of `tokens` under `salt` in any adapter namespace (event
        hashes leave extra_key out, so a router credits them all)."""
        best = 0
        for ek in ADAPTERS:
            m = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(list(tokens), ek, cache_salt=salt)))
            best = max(best, len(m.device_indices) // PAGE)
        return best


def tree_truth(cache: RadixCache) -> Counter[int]:
    """Published-hash copies the radix tree holds: every live node's pages, hashed from its path."""
    out: Counter[int] = Counter()
    stack = [(child, None) for child in cache.root_node.children.values()]
    while stack:
        node, prior = stack.pop()
        if node.value is None:
            continue
        ns = Namespace(node.key.extra_key, node.key.cache_salt)
        hexes = event_hashes(list(node.key.token_ids[: len(node.key)]), PAGE, ns, prior)
        out.update(to_int64(h) for h in hexes)
        last = hexes[-1] if hexes else prior
        stack.extend((c, last) for c in node.children.values())
    return out


def workload(n: int, seed: int = 7) -> list[Request]:
    """n requests over 6 shared system prompts, 3 adapters and 2 salts, many repeats (cache hits)."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 30000) for _ in range(PAGE * rng.randint(1, 3))] for _ in range(6)]
    bodies = [[rng.randrange(1, 30000) for _ in range(rng.randint(8, 70))] for _ in range(40)]
    out = []
    for _ in range(n):
        toks = rng.choice(systems) + rng.choice(bodies)
        out.append(Request(toks, rng.choice(ADAPTERS), rng.choice(SALTS)))
    return out
