"""A vLLM-faithful simulated worker: vLLM 0.33's block pool behaviour and its KV events, byte for byte in shape.

What it emits is what a vLLM 0.33 GPU worker emits (schemas/README.md, "Reading vLLM streams"):
block hashes from vLLM's chain (kvevents.engines.vllm: sha256 pickle or sha256_cbor, the default
seed) as uint64, `extra_keys` untagged per block, `group_idx`, one `BlockRemoved` per evicted hash,
duplicates (a hash cached again after its ancestor was evicted gets a second physical block), and
the strict 3-element batch `[ts, events, rank]`, no batch for a step without events. The pool is
an LRU free queue like vLLM's: a finished request's blocks go back tail first, hits leave the
queue, allocation evicts from the front (so a parent may go before its children).

With `sliding_window_blocks`, a second KV-cache group (group_idx 1, a sliding-window group of a
hybrid model) stores only the blocks inside the window, its `token_ids` spanning the skipped null
blocks too. Deterministic and synchronous, like kvevents.sim.worker.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvevents.engines.vllm import (
    event_extra_keys,
    tagged_extra_keys,
    to_event_hash,
    vllm_block_hashes,
)
from kvevents.engines.vllm_wire import encode_vllm_batch, removed_event, stored_event

__all__ = ["CachedBlock", "VllmServeResult", "VllmSimWorker"]


@dataclass(slots=True)
class _Block:
    bid: int
    digest: bytes | None = None
    prefix: list[int] | None = None  # tokens from 0 to the end of this block (tests, snapshots)
    salt: str | None = None
    lora: str | None = None
    extras: list[Any] | None = None  # untagged extra keys of blocks 0..i (mm pairs mixed into keys)
    windowed: bool = False  # also stored in the sliding-window group


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """A cached physical block as a consumer should know it: its whole token prefix and namespace."""

    prefix: list[int]
    cache_salt: str | None
    lora_name: str | None
    page_extra_keys: list[Any] | None
    event_hash: int


@dataclass(frozen=True, slots=True)
class VllmServeResult:
    num_tokens: int
    hit_tokens: int


class VllmSimWorker:
    """One vLLM 0.33 worker's prefix cache and event stream (group 0: full attention).

    `serve(tokens, ...)` or `serve_request(sim.Request)` runs one request (hit, allocate, evict,
    cache the new full blocks); `take_events()` hands over the step's events, `take_payload()` the
    encoded batch (None for an empty step, as vLLM sends nothing then).
    """

    def __init__(
        self,
        name: str = "vllm",
        *,
        block_size: int = 16,
        capacity_blocks: int = 4096,
        hash_algo: str = "sha256",
        hash_seed: str | None = None,
        dp_rank: int | None = 0,
        sliding_window_blocks: int | None = None,
        lora_paths: Mapping[str, str] | None = None,
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be an integer >= 1, got {capacity_blocks!r}")
        vllm_block_hashes([], 1, hash_algo=hash_algo)  # ValueError now for an unknown algo
        self.name = name
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.hash_algo = hash_algo
        self.hash_seed = hash_seed
        self.dp_rank = dp_rank
        self.sliding_window_blocks = sliding_window_blocks
        self.lora_paths = dict(lora_paths or {})  # vLLM hashes the adapter path; default /adapters/<name>
        self._blocks = [_Block(i) for i in range(capacity_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(capacity_blocks))
        self._cached: dict[bytes, dict[int, None]] = {}
        self._events: list[dict[str, Any]] = []
        self.requests = 0
        self.tokens = 0
        self.hit_tokens = 0
        self.evictions = 0
        self.resets = 0

    # ---------------------------------------------------------------- requests

    def serve_request(self, request: Any) -> VllmServeResult:
        """Serve a kvevents.sim.worker.Request (its namespace salt is vLLM's cache_salt, lora_name its adapter)."""
        ns = request.namespace
        return self.serve(
            request.tokens,
            cache_salt=ns.cache_salt,
            lora_name=request.lora_name,
            mm_per_block=getattr(request, "mm_per_block", None),
        )

    def serve(
        self,
        tokens: Sequence[int],
        *,
        cache_salt: str | None = None,
        lora_name: str | None = None,
        lora_id: int | None = None,
        mm_per_block: Sequence[Sequence[tuple[str, int]]] | None = None,
    ) -> VllmServeResult:
        """One request: match cached blocks, allocate (evicting LRU), cache the new full blocks."""
        ps = self.block_size
        n = min(len(tokens) // ps, self.capacity_blocks)
        tokens = list(tokens[: n * ps])
        if lora_name is not None and lora_id is None:
            lora_id = 1 + sum(map(ord, lora_name)) % 1000  # vLLM's int id, stable per name here
        mm = list(mm_per_block[:n]) + [[]] * max(0, n - len(mm_per_block)) if mm_per_block is not None else None
        tagged = tagged_extra_keys(
            n,
            lora_name=lora_name,
            lora_path=None if lora_name is None else self.lora_paths.get(lora_name, f"/adapters/{lora_name}"),
            cache_salt=cache_salt,
            mm_per_block=mm,
        )
        digests = vllm_block_hashes(
            tokens, ps, hash_algo=self.hash_algo, extra_keys_per_block=tagged, seed=self.hash_seed
        )
        untagged = event_extra_keys(tagged)
        hit = 0
        while hit < n and digests[hit] in self._cached:
            hit += 1
        used: list[_Block] = []
        for d in digests[:hit]:
            bid = next(iter(self._cached[d]))
            self._free.pop(bid, None)  # a hit leaves the free queue while the request runs
            used.append(self._blocks[bid])
        new = [self._allocate() for _ in range(n - hit)]
        for i, blk in enumerate(new, start=hit):
            blk.digest = digests[i]
            blk.prefix = tokens[: (i + 1) * ps]
            blk.salt, blk.lora = cache_salt, lora_name
            blk.extras = [list(k) if k is not None else None for k in untagged[: i + 1]]
            self._cached.setdefault(digests[i], {})[blk.bid] = None
        if new:
            self._emit_store(digests, untagged, tokens, hit, n, lora_id, lora_name, new)
        for blk in reversed(used + new):  # vLLM frees a request's blocks tail first
            self._free[blk.bid] = None
        self.requests += 1
        self.tokens += len(tokens)
        self.hit_tokens += hit * ps
        return VllmServeResult(len(tokens), hit * ps)

    def _allocate(self) -> _Block:
        bid, _ = self._free.popitem(last=False)
        blk = self._blocks[bid]
        if blk.digest is not None:
            holders = self._cached[blk.digest]
            del holders[bid]
            if not holders:
                del self._cached[blk.digest]
            h = to_event_hash(blk.digest)
            self._events.append(removed_event([h], "GPU", group_idx=0))
            if blk.windowed:
                self._events.append(removed_event([h], "GPU", group_idx=1))
            self.evictions += 1
            blk.digest = blk.prefix = blk.extras = None
            blk.windowed = False
        return blk

    def _emit_store(
        self,
        digests: list[bytes],
        untagged: list[Any],
        tokens: list[int],
        hit: int,
        n: int,
        lora_id: int | None,
        lora_name: str | None,
        new: list[_Block],
    ) -> None:
        ps = self.block_size
        parent = to_event_hash(digests[hit - 1]) if hit else None
        hashes = [to_event_hash(d) for d in digests[hit:n]]
        extras = untagged[hit:n]
        extra_keys = (
            [list(k) if k is not None else None for k in extras] if any(k is not None for k in extras) else None
        )
        span = tokens[hit * ps : n * ps]
        self._events.append(
            stored_event(
                hashes,
                parent,
                span,
                ps,
                lora_id=lora_id,
                medium="GPU",
                lora_name=lora_name,
                extra_keys=extra_keys,
                group_idx=0,
                kv_cache_spec_kind="full_attention",
            )
        )
        w = self.sliding_window_blocks
        if w is not None:  # the window keeps the last w blocks; the ones before are null blocks
            keep = list(range(max(hit, n - w), n))
            if keep:
                for i in keep:
                    new[i - hit].windowed = True
                self._events.append(
                    stored_event(
                        [to_event_hash(digests[i]) for i in keep],
                        parent,
                        span,
                        ps,
                        lora_id=lora_id,
                        medium="GPU",
                        lora_name=lora_name,
                        extra_keys=None if extra_keys is None else [extra_keys[i - hit] for i in keep],
                        group_idx=1,
                        kv_cache_spec_kind="sliding_window",
                        kv_cache_spec_sliding_window=w * ps,
                    )
                )

    # ---------------------------------------------------------------- events and state

    def reset(self) -> None:
        """reset_prefix_cache(): every cached block goes, one AllBlocksCleared."""
        for blk in self._blocks:
            blk.digest = blk.prefix = blk.extras = None
            blk.windowed = False
        self._cached.clear()
        self._free = OrderedDict((i, None) for i in range(self.capacity_blocks))
        self._events.append({"type": "AllBlocksCleared"})
        self.resets += 1

    def take_events(self) -> list[dict[str, Any]]:
        """The events since the last take, in order (vLLM event maps)."""
        out, self._events = self._events, []
        return out

    def take_payload(self, ts: float = 0.0) -> bytes | None:
        """The step's batch as vLLM 0.33 encodes it, or None when the step produced no events."""
        events = self.take_events()
        if not events:
            return None
        return encode_vllm_batch(ts, events, self.dp_rank)

    def cached_blocks(self) -> list[CachedBlock]:
        """Every cached physical block (duplicates included), for checks against a consumer's view."""
        out = []
        for blk in self._blocks:
            if blk.digest is not None and blk.prefix is not None:
                out.append(CachedBlock(blk.prefix, blk.salt, blk.lora, blk.extras, to_event_hash(blk.digest)))
        return out

    @property
    def device_hit_tokens(self) -> int:
        """Tokens served from cached blocks (SimWorker's name, for status lines)."""
        return self.hit_tokens

    def stats(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "device_hit_tokens": self.hit_tokens,
            "evictions": self.evictions,
            "resets": self.resets,
            "device_pages": sum(len(v) for v in self._cached.values()),
        }
