"""Token-derived keys: index any engine's stream (vLLM, SGLang, ...) by the contract's event hashes.

A `SourceKeyer` sits between the subscriber and `BlockIndex`. Per source it runs in one mode:
- `contract`: published hash == the contract's event hash; batches pass through untouched.
- `tokens`: engine hashes are opaque ids. Each stored block's key is the contract event hash of
  its `token_ids`, chained from the parent block's key (a head is seeded by the salt, as in the
  contract), so a request hashed by `PrefixRouter` finds it whatever the engine. A per-(source,
  dp_rank) map from engine hash to key digest serves parents and removes and loses the entry with
  the block's last copy (digests are shared between maps: one bytes object per distinct key).
- `auto` (default): batches wait (bounded) until a head store shows whether the published hashes
  recompute under the contract; then `contract` or `tokens` (kvevents.consumers.key_modes).

vLLM's fields (schemas/README.md, "Reading vLLM streams"): the lora name stays the event's
`lora_name` (adapter-aware lookups); the cache salt (first block's extra keys, or the contract's
`cache_salt`) seeds the head; multimodal `(identifier, offset)` pairs and prompt-embeds digests
are mixed into the key (kvevents.consumers.keys) so such a block never matches a text-only request;
only KV-cache group `group_idx` (default 0, the full-attention group of vLLM's hybrid models) is
indexed, other groups are counted and skipped. Input that cannot be keyed exactly (token count
not matching the hashes, e.g. spans over skipped null blocks; an unknown or unkeyed parent; a hash
of a type the map cannot hold; a block size other than the router's page size) is counted per
source and never indexed: a missed block, never a wrong key.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Mapping
from typing import Any, cast

from kvevents.consumers.key_modes import KEY_MODES, AutoHold, KeyMode, parse_key_mode, parse_key_modes
from kvevents.consumers.keys import (
    block_extras,
    engine_hash_key,
    key_chain,
    key_int64,
    keys_int64,
    mix_extra_keys,
    request_keys,
)
from kvevents.consumers.worker_key import WorkerKey
from kvevents.engines.vllm_wire import (
    VllmBlockRemoved,
    VllmBlockStored,
    decode_vllm_batch,
)
from kvevents.errors import DecodeError
from kvevents.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
)
from kvevents.hashing import Namespace, event_seed, pack_tokens

__all__ = [
    "KEY_MODES",
    "KeyMode",
    "SourceKeyer",
    "mix_extra_keys",
    "parse_key_mode",
    "parse_key_modes",
    "request_keys",
]

_U64 = (1 << 64) - 1
_UNKEYED = b""  # map value of a block that could not be keyed exactly (its children cannot either)
_INT_ONLY = {int}
_REMOVED_HAS_LORA = "lora_name" in BlockRemoved.__struct_fields__


def _engine_hashes(c: Counter[str], raw: Any) -> list[int | bytes] | None:
    """A store's engine hashes as map keys; None (counted) when empty or one is not a hash (the
    block could never be removed: not indexed at all)."""
    if type(raw) is list and raw and set(map(type, raw)) == _INT_ONLY and min(raw) >= 0 and max(raw) <= _U64:
        maybe: list[Any] = raw  # the common case (vLLM's uint64s): no per-hash call
    else:
        maybe = [engine_hash_key(h) for h in raw] if isinstance(raw, list) else [None]
    if not maybe:
        c["empty_store"] += 1
        return None
    if None in maybe:
        c["bad_hash"] += 1
        return None
    return cast("list[int | bytes]", maybe)


def _parent_key(chain: _Chain, parent: Any) -> tuple[bytes, int] | str:
    """A child's prior: its parent's key digest and int64 key, or the reason it cannot be keyed."""
    ph = engine_hash_key(parent)
    got = None if ph is None else chain.digests.get(ph)
    if got is None:
        return "bad_hash" if ph is None else "unknown_parent"
    if got is _UNKEYED:
        return "unkeyed_parent"
    return got, key_int64(got)


class _Chain:
    """One (source, dp_rank)'s engine-hash map: digest per hash, extra copies, lora per lora block."""

    __slots__ = ("digests", "dups", "loras")

    def __init__(self) -> None:
        self.digests: dict[int | bytes, bytes] = {}
        self.dups: dict[int | bytes, int] = {}
        self.loras: dict[int | bytes, str] = {}


def _refs_when_only_interned() -> int:
    """sys.getrefcount of a digest held only by the intern dict (key and value) and one local name."""
    probe = bytes(bytearray(32))
    canon = {probe: probe}
    n = sys.getrefcount(probe)
    del canon
    return n


class SourceKeyer:
    """Translates each source's batches into contract-keyed batches for `BlockIndex.apply`.

    `translate(source, batch, payload)` returns the batches to apply (none while `auto` waits,
    several when it decides); `apply(index, ...)` does both. `reset(source, dp_rank)` drops the
    maps with the index's copies (subscriber resets). Counters per source: `stats()`. Not
    thread-safe (the service calls it under its index lock).
    """

    def __init__(
        self,
        page_size: int,
        *,
        default_mode: str = "auto",
        modes: Mapping[str, str] | None = None,
        group_idx: int = 0,
        auto_max_batches: int = 1024,
    ) -> None:
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
        if default_mode not in KEY_MODES:
            raise ValueError(f"default_mode must be one of {', '.join(KEY_MODES)}, got {default_mode!r}")
        self.page_size = page_size
        self.default_mode = default_mode
        self.group_idx = group_idx
        self.auto_max_batches = auto_max_batches
        self._modes: dict[str, str] = {}
        self._configured: dict[str, str] = {}
        self._held = AutoHold()  # auto's batches, until its mode is known
        self._chains: dict[WorkerKey, _Chain] = {}
        self._canon: dict[bytes, bytes] = {}
        self._counters: dict[str, Counter[str]] = {}
        self._only_interned = _refs_when_only_interned()
        for name, mode in (modes or {}).items():
            self.set_mode(name, mode)

    # ---------------------------------------------------------------- modes and counters

    def set_mode(self, source: str, mode: str) -> None:
        """Fix a source's mode (`auto` re-detects from its next head store); its maps are dropped."""
        if mode not in KEY_MODES:
            raise ValueError(f"key mode for {source!r} must be one of {', '.join(KEY_MODES)}, got {mode!r}")
        self._configured[source] = mode
        self._modes[source] = mode
        self.reset(source)

    def mode(self, source: str) -> str:
        """The mode a source runs in now: contract, tokens, or auto (still detecting)."""
        return self._modes.get(source) or self._configured.get(source) or self.default_mode

    def _count(self, source: str) -> Counter[str]:
        c = self._counters.get(source)
        if c is None:
            c = self._counters[source] = Counter()
        return c

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per source: its mode, the configured mode, blocks in its maps, and its counters."""
        out: dict[str, dict[str, Any]] = {}
        for source in sorted(set(self._counters) | set(self._modes) | set(self._configured)):
            row: dict[str, Any] = {
                "mode": self.mode(source),
                "configured": self._configured.get(source, self.default_mode),
                "mapped_blocks": self.mapped_blocks(source),
            }
            row.update(sorted(self._counters.get(source, Counter()).items()))
            out[source] = row
        return out

    def mapped_blocks(self, source: str | None = None) -> int:
        """Engine hashes held in the maps (all sources, or one)."""
        return sum(len(c.digests) for key, c in self._chains.items() if source is None or key.source == source)

    def interned_digests(self) -> int:
        """Distinct key digests held (shared by every map)."""
        return len(self._canon)

    # ---------------------------------------------------------------- feed

    def apply(self, index: Any, source: str, batch: KVEventBatch | None = None, payload: bytes | None = None) -> int:
        """Translate and apply to `index` (a BlockIndex); returns the number of batches applied."""
        out = self.translate(source, batch, payload)
        for b in out:
            index.apply(source, b)
        return len(out)

    def translate(
        self, source: str, batch: KVEventBatch | None = None, payload: bytes | None = None
    ) -> list[KVEventBatch]:
        """The contract-keyed batches for one delivered batch (decoded, raw payload, or both).

        In tokens mode the raw payload is read again with every vLLM field (extra_keys, group_idx,
        raw hashes); without it the decoded batch's fields are used (no extra keys, group 0).
        """
        mode = self.mode(source)
        if mode == "contract":
            if batch is None:
                b = self._decode(source, payload)
                return [] if b is None else [b]
            return [batch]
        if mode == "tokens":
            out = self._tokens(source, batch, payload)
            return [] if out is None else [out]
        return self._auto(source, batch, payload)

    def _decode(self, source: str, payload: bytes | None) -> KVEventBatch | None:
        if payload is None:
            raise ValueError("translate needs a decoded batch or its payload")
        try:
            return decode_batch(payload)
        except DecodeError:
            self._count(source)["undecodable"] += 1
            return None

    # ---------------------------------------------------------------- auto detection

    def _auto(self, source: str, batch: KVEventBatch | None, payload: bytes | None) -> list[KVEventBatch]:
        b = batch if batch is not None else self._decode(source, payload)
        count = lambda: self._count(source)  # noqa: E731 - called only when there is something to count
        decided, ready = self._held.offer(source, b, payload, count, self.page_size, self.auto_max_batches)
        if decided is None:
            return [rb for rb, _ in ready]  # a batch with nothing keyed passes now, in either mode
        self._modes[source] = decided
        out: list[KVEventBatch] = []
        for pb, pp in ready:
            out.extend(self.translate(source, pb, pp))
        return out

    # ---------------------------------------------------------------- tokens mode

    def _tokens(self, source: str, batch: KVEventBatch | None, payload: bytes | None) -> KVEventBatch | None:
        c = self._count(source)
        if payload is not None:
            try:
                vb = decode_vllm_batch(payload)
            except DecodeError:
                c["undecodable"] += 1
                return None
            events: list[Any] = vb.events
            rank = vb.data_parallel_rank
            ts = vb.ts
        elif batch is not None:
            events, rank, ts = batch.events, batch.data_parallel_rank, batch.ts
        else:
            raise ValueError("translate needs a decoded batch or its payload")
        worker = WorkerKey.of(source, rank)  # the worker BlockIndex files the batch under
        chain = self._chains.get(worker)
        if chain is None:
            chain = self._chains[worker] = _Chain()
        out: list[Any] = []
        c["batches"] += 1
        for ev in events:
            t = type(ev)
            if t is VllmBlockStored or t is BlockStored:
                if getattr(ev, "group_idx", None) not in (None, self.group_idx):
                    c["other_group_events"] += 1
                    continue
                st = self._store(c, chain, ev)
                if st is not None:
                    out.append(st)
            elif t is VllmBlockRemoved or t is BlockRemoved:
                if getattr(ev, "group_idx", None) not in (None, self.group_idx):
                    c["other_group_events"] += 1
                    continue
                self._remove(c, chain, ev, out)
            else:  # AllBlocksCleared (either decoder)
                c["cleared"] += 1
                self._drop_chain(chain)
                out.append(AllBlocksCleared())
        return KVEventBatch(ts, out, rank)

    def _release(self, d: bytes) -> None:
        """Forget an interned digest once no map holds it (its refcount is the intern dict's own)."""
        if d and sys.getrefcount(d) <= self._only_interned + 1:  # +1: the caller's reference
            self._canon.pop(d, None)

    def _unkeyed(self, c: Counter[str], chain: _Chain, ev: Any, hashes: list[Any], reason: str) -> BlockStored | None:
        """A store that cannot be keyed from its own fields: counted; its hashes stay in the map
        (unkeyed) for their removes and children. A hash already keyed names the same block (same
        engine hash, same content): that copy is stored under the known key."""
        c[reason] += 1
        digests, dups, loras = chain.digests, chain.dups, chain.loras
        known: list[int] = []
        lora = None
        for h in hashes:
            old = digests.get(h)
            if old is None:
                digests[h] = _UNKEYED
                c["unkeyed_blocks"] += 1
                continue
            dups[h] = dups.get(h, 0) + 1
            if old is _UNKEYED:
                c["unkeyed_blocks"] += 1
            elif not known or loras.get(h) == lora:
                lora = loras.get(h)
                known.append(key_int64(old))
            else:
                c["unkeyed_blocks"] += 1  # pragma: no cover - one event's blocks share an adapter
        if not known:
            return None
        c["stored_blocks"] += len(known)
        return BlockStored(
            known,
            None,
            [],
            ev.block_size if isinstance(ev.block_size, int) and ev.block_size > 0 else self.page_size,
            ev.lora_id,
            ev.medium,
            lora,
        )

    def _store(self, c: Counter[str], chain: _Chain, ev: Any) -> BlockStored | None:
        """A store keyed from its own fields (tokens, extra keys, its parent's key), or unkeyed
        (counted by reason) when they do not allow an exact key."""
        hashes = _engine_hashes(c, ev.block_hashes)
        if hashes is None:
            return None
        n, ps = len(hashes), self.page_size
        tokens, lora = ev.token_ids, ev.lora_name
        if not isinstance(lora, str):
            lora = None
        extras = getattr(ev, "extra_keys", None)
        if ev.block_size != ps:
            return self._unkeyed(c, chain, ev, hashes, "block_size_mismatch")
        if not isinstance(tokens, list) or len(tokens) != n * ps:
            return self._unkeyed(c, chain, ev, hashes, "token_count_mismatch")
        if extras is not None and (not isinstance(extras, list) or len(extras) != n):
            return self._unkeyed(c, chain, ev, hashes, "bad_extra_keys")
        parent = ev.parent_block_hash
        head = self._head(c, ev, extras, lora) if parent is None else _parent_key(chain, parent)
        if isinstance(head, str):
            return self._unkeyed(c, chain, ev, hashes, head)
        prior, parent_key = head
        try:
            mixed = block_extras(extras, lora, parent is None) if extras is not None else None
            if mixed is not None and any(mixed):
                c["mixed_blocks"] += sum(1 for m in mixed if m)
            else:
                mixed = None
            digests = key_chain(pack_tokens(tokens), ps, prior, mixed)
        except ValueError:
            return self._unkeyed(c, chain, ev, hashes, "bad_extra_keys" if extras is not None else "bad_tokens")
        keys = self._keep(c, chain, hashes, digests, lora)
        if not keys:
            return None
        return BlockStored(keys, parent_key, tokens, ps, ev.lora_id, ev.medium, lora)

    def _head(self, c: Counter[str], ev: Any, extras: Any, lora: str | None) -> tuple[bytes | None, None] | str:
        """A chain head's prior (the seed of its cache_salt, from the event or its first block's
        extra keys): (prior, no parent key), or the reason it cannot be keyed."""
        salt = ev.cache_salt if isinstance(ev.cache_salt, str) else None
        if extras is not None and extras[0] is not None:
            strings = [k for k in extras[0] if isinstance(k, str)] if isinstance(extras[0], list) else None
            if strings is None:
                return "bad_extra_keys"
            if lora is not None and lora in strings:
                strings.remove(lora)
            if len(strings) > 1 or (strings and salt is not None and strings[0] != salt):
                return "bad_extra_keys"
            if strings:
                salt = strings[0]
        seed = event_seed(Namespace(cache_salt=salt)) if salt else None
        if salt:
            c["salted_heads"] += 1
        return (None if seed is None else bytes.fromhex(seed)), None

    def _keep(
        self, c: Counter[str], chain: _Chain, hashes: list[int | bytes], digests: list[bytes], lora: str | None
    ) -> list[int]:
        """Map each engine hash to its key digest; returns the keys to index (a hash already keyed
        differently is skipped, counted: never a wrong key)."""
        ints = keys_int64(digests)
        keys = ints
        cmap, dups, loras = chain.digests, chain.dups, chain.loras
        get, intern = cmap.get, self._canon.setdefault
        if cmap.keys().isdisjoint(hashes) and len(set(hashes)) == len(hashes):  # all new (the common case): C-level
            cmap.update(zip(hashes, map(intern, digests, digests)))  # one bytes object per distinct key
            if lora is not None:
                loras.update(dict.fromkeys(hashes, lora))
            c["stored_blocks"] += len(hashes)
            return keys
        for k, (h, d) in enumerate(zip(hashes, digests)):
            old = get(h)
            if old is None:
                cmap[h] = intern(d, d)  # one bytes object per distinct key, shared by every map
                if lora is not None:
                    loras[h] = lora
            elif old == d:
                dups[h] = dups.get(h, 0) + 1
            else:  # the same engine hash keyed differently (or unkeyed before): skip, never a wrong key
                c["hash_conflict"] += 1
                if keys is ints:
                    keys = ints[:k]
                continue
            if keys is not ints:
                keys.append(ints[k])
        if keys:
            c["stored_blocks"] += len(keys)
        return keys

    def _remove(self, c: Counter[str], chain: _Chain, ev: Any, out: list[Any]) -> None:
        raw = ev.block_hashes if isinstance(ev.block_hashes, list) else [None]
        cmap, dups, loras = chain.digests, chain.dups, chain.loras
        medium = ev.medium
        for h in raw:
            eh = engine_hash_key(h)
            if eh is None:
                c["bad_hash"] += 1
                continue
            d = cmap.get(eh)
            if d is None:
                c["unknown_remove"] += 1
                continue
            extra = dups.get(eh)
            if extra:
                lora = loras.get(eh)
                if extra == 1:
                    del dups[eh]
                else:
                    dups[eh] = extra - 1
            else:
                del cmap[eh]
                lora = loras.pop(eh, None) if loras else None
                self._release(d)
            if d is _UNKEYED:
                c["unkeyed_removes"] += 1
                continue
            c["removed_blocks"] += 1
            key = [key_int64(d)]
            out.append(
                BlockRemoved(key, medium, lora_name=lora) if _REMOVED_HAS_LORA and lora else BlockRemoved(key, medium)
            )

    def _drop_chain(self, chain: _Chain) -> None:
        chain.dups.clear()
        chain.loras.clear()
        digests = chain.digests
        while digests:  # one digest at a time: no list keeps them alive past _release
            d = digests.popitem()[1]
            self._release(d)

    def reset(self, source: str, dp_rank: int | None = None) -> None:
        """Drop the maps of a source (one dp rank, or all) and any batches `auto` still holds."""
        for key in [k for k in self._chains if k.source == source and (dp_rank is None or k.dp_rank == dp_rank)]:
            chain = self._chains.pop(key)
            self._drop_chain(chain)
        dropped = self._held.drop(source, dp_rank)
        if dropped is not None:
            self._count(source)["auto_dropped_on_reset"] += dropped
