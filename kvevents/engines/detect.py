"""Which hash chain a stream publishes, told from one chain head: the contract's event chain, vLLM
0.33's (sha256 or sha256_cbor), or another engine's own ids.

A chain head (a BlockStored without a parent, whole pages of `block_size` tokens) is recomputed
under each chain; the first that gives its published hashes names the stream's. vLLM's chain is
seeded by PYTHONHASHSEED when the environment sets it (as vLLM is). A head whose hashes cannot be
recomputed from its own fields (a LoRA block: vLLM hashes the adapter's path, never published) is
inconclusive, as is any event that is not a head: `None`, ask again with the next one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from kvevents.hashing import Namespace, event_hashes_int64

__all__ = ["HASH_CHAINS", "OTHER", "head_chain"]

OTHER = "other"  # a head recomputes under none of the chains below: the engine's own ids
#: The names `head_chain` answers, as `doctor --profile` and `conformance --profile` spell them.
HASH_CHAINS: tuple[str, ...] = ("contract", "vllm-sha256", "vllm-sha256_cbor", OTHER)
_U64 = (1 << 64) - 1


def _u64(hashes: Sequence[Any]) -> list[int] | None:
    """Published hashes as uint64 (the contract's signed int64 and vLLM's uint64 alike); None when
    one is not an integer (raw digest bytes: compared by their first 8 bytes, as decoders read them)."""
    out = []
    for h in hashes:
        if isinstance(h, (bytes, bytearray)) and len(h) >= 8:
            out.append(int.from_bytes(h[:8], "big"))
        elif isinstance(h, int) and not isinstance(h, bool):
            out.append(h & _U64)
        else:
            return None
    return out


def _vllm_keys(ev: Any, n: int) -> list[Any] | None | bool:
    """vLLM's tagged hash keys per block from the event's untagged `extra_keys` (None: no keys);
    False when they cannot be rebuilt (a LoRA block, an unknown key)."""
    extra = getattr(ev, "extra_keys", None)
    if extra is None or (isinstance(extra, list) and all(k is None for k in extra)):
        return None
    if not isinstance(extra, list) or len(extra) < n:
        return False
    out: list[Any] = []
    for keys in extra[:n]:
        tagged: list[Any] = []
        for k in keys or ():
            if isinstance(k, str) and k != ev.lora_name:
                tagged.append(("cache_salt", k))
            elif isinstance(k, (list, tuple)) and len(k) == 2:
                tagged.append(("mm", k[0], k[1]))
            elif isinstance(k, bytes):
                tagged.append(("prompt_embeds", k))
            else:
                return False  # the adapter's path is hashed, never published
        out.append(tuple(tagged) if tagged else None)
    return out


def _vllm_chain(ev: Any, tokens: list[int], bs: int, published: list[int]) -> str | None:
    """vllm-sha256 / vllm-sha256_cbor when the head recomputes under it; OTHER when under neither;
    None when it cannot be told (a LoRA head)."""
    from kvevents.engines import vllm

    keys = _vllm_keys(ev, len(published))
    if keys is False or (ev.lora_name and keys is None):
        return None
    seed = os.environ.get("PYTHONHASHSEED")
    for algo in vllm.HASH_ALGOS:
        try:
            got = vllm.vllm_event_hashes(tokens, bs, hash_algo=algo, extra_keys_per_block=keys, seed=seed)  # type: ignore[arg-type]
        except (ImportError, ValueError):  # cbor2 missing, or keys it cannot hash
            continue
        if got == published:
            return f"vllm-{algo}"
    return OTHER


def head_chain(ev: Any) -> str | None:
    """The chain a BlockStored's hashes follow (HASH_CHAINS), or None when this event cannot tell:
    not a head, partial pages, no hashes, or a head only its engine can recompute (a LoRA block)."""
    hashes = getattr(ev, "block_hashes", None)
    bs, tokens = getattr(ev, "block_size", None), getattr(ev, "token_ids", None)
    if getattr(ev, "parent_block_hash", 0) is not None or not isinstance(hashes, list) or not hashes:
        return None
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1 or not isinstance(tokens, list):
        return None
    if len(tokens) != len(hashes) * bs or getattr(ev, "group_idx", None) not in (None, 0):
        return None
    published = _u64(hashes)
    if published is None:
        return None
    salt = ev.cache_salt if isinstance(getattr(ev, "cache_salt", None), str) else None
    try:
        if [h & _U64 for h in event_hashes_int64(tokens, bs, Namespace(cache_salt=salt))] == published:
            return "contract"
    except ValueError:  # a token id outside 0..2**32-1: no chain takes it
        return None
    return _vllm_chain(ev, tokens, bs, published)
