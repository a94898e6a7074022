"""vLLM 0.33's prefix-cache block hashes: the chain, its seed, its extra keys, the published uint64.

Written from the facts of vLLM 0.33 (no vLLM code): block i's digest is
`H_i = hash_fn((H_{i-1}, tuple(block_tokens), extra_keys_i))` with `H_{-1} = NONE_HASH = hash_fn(seed)`;
`hash_fn` is SHA-256 over `pickle.dumps(obj, HIGHEST_PROTOCOL)` ("sha256", vLLM's default) or over
`cbor2.dumps(obj, canonical=True)` ("sha256_cbor"); the seed is PYTHONHASHSEED when set, else
"vllm-none-hash" (vLLM >= 0.29 for the sha256 family). Events publish each digest's last 8 bytes
as an unsigned big-endian int (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, default on).

Stable public API (the conformance kit imports it): HASH_ALGOS, DEFAULT_SEED, hash_function,
none_hash, hash_block, vllm_block_hashes, vllm_event_hashes, to_event_hash, tagged_extra_keys,
untag_extra_keys, event_extra_keys. Golden vectors: schemas/golden/vllm-0.33.json.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any, Literal

__all__ = [
    "DEFAULT_SEED",
    "HASH_ALGOS",
    "PROFILES",
    "HashAlgo",
    "event_extra_keys",
    "hash_block",
    "hash_function",
    "none_hash",
    "tagged_extra_keys",
    "to_event_hash",
    "untag_extra_keys",
    "vllm_block_hashes",
    "vllm_event_hashes",
]

HashAlgo = Literal["sha256", "sha256_cbor"]
#: The algorithms reproduced here (vLLM's xxhash variants need a random or shared seed: not covered).
HASH_ALGOS: tuple[str, ...] = ("sha256", "sha256_cbor")
#: NONE_HASH's seed when PYTHONHASHSEED is unset (vLLM >= 0.29, sha256 family).
DEFAULT_SEED = "vllm-none-hash"
#: `kvevents hash --profile` names -> hash algo.
PROFILES: dict[str, str] = {"vllm-sha256": "sha256", "vllm-sha256_cbor": "sha256_cbor"}
_U64 = (1 << 64) - 1


def _sha256_pickle(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2  # imported on first use: only the cbor profile needs it

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def hash_function(hash_algo: str = "sha256") -> Callable[[Any], bytes]:
    """vLLM's `hash_fn` for an algo name: object -> 32-byte digest (ValueError for other names)."""
    if hash_algo == "sha256":
        return _sha256_pickle
    if hash_algo == "sha256_cbor":
        return _sha256_cbor
    raise ValueError(f"hash_algo must be one of {', '.join(HASH_ALGOS)}, got {hash_algo!r}")


def none_hash(hash_algo: str = "sha256", seed: str | None = None) -> bytes:
    """NONE_HASH, the parent digest of a request's first block: hash_fn(PYTHONHASHSEED or DEFAULT_SEED)."""
    if seed is not None and not isinstance(seed, str):
        raise ValueError(f"seed must be the PYTHONHASHSEED string or None, got {type(seed).__name__}")
    return hash_function(hash_algo)(DEFAULT_SEED if seed is None else seed)


def _as_tuple(value: Any) -> Any:
    """Lists (JSON, msgpack) back to the tuples vLLM hashes (pickle and CBOR see a tuple as a tuple)."""
    if isinstance(value, (list, tuple)):
        return tuple(_as_tuple(v) for v in value)
    return value


def _check_tokens(block_tokens: Sequence[int]) -> tuple[int, ...]:
    out = tuple(block_tokens)
    for pos, tok in enumerate(out):
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
            raise ValueError(f"token id {tok!r} at position {pos} is not a non-negative integer")
    return out


def hash_block(
    parent: bytes, block_tokens: Sequence[int], extra_keys: Sequence[Any] | None = None, hash_algo: str = "sha256"
) -> bytes:
    """One link of the chain: hash_fn((parent digest, tuple(block tokens), extra_keys or None))."""
    if not isinstance(parent, bytes):
        raise ValueError(f"parent must be a digest (bytes), got {type(parent).__name__}")
    keys = None if extra_keys is None else _as_tuple(extra_keys)
    return hash_function(hash_algo)((parent, _check_tokens(block_tokens), keys))


def vllm_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    hash_algo: str = "sha256",
    extra_keys_per_block: Sequence[Sequence[Any] | None] | None = None,
    seed: str | None = None,
    parent: bytes | None = None,
) -> list[bytes]:
    """vLLM's digests of every *full* block of `token_ids` (a partial tail is never hashed).

    extra_keys_per_block: the *tagged* hash keys per block (see `tagged_extra_keys`), None entries
    for none; seed: PYTHONHASHSEED (None: the default seed); parent: continue after this digest
    instead of starting from NONE_HASH.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be an integer >= 1, got {block_size!r}")
    fn = hash_function(hash_algo)
    tokens = _check_tokens(token_ids)
    n = len(tokens) // block_size
    if extra_keys_per_block is not None and len(extra_keys_per_block) < n:
        raise ValueError(f"extra_keys_per_block has {len(extra_keys_per_block)} entries for {n} full blocks")
    prev = none_hash(hash_algo, seed) if parent is None else parent
    if not isinstance(prev, bytes):
        raise ValueError(f"parent must be a digest (bytes), got {type(prev).__name__}")
    out: list[bytes] = []
    for i in range(n):
        keys = None if extra_keys_per_block is None else extra_keys_per_block[i]
        prev = fn((prev, tokens[i * block_size : (i + 1) * block_size], None if keys is None else _as_tuple(keys)))
        out.append(prev)
    return out


def to_event_hash(digest: bytes) -> int:
    """The published form: the digest's last 8 bytes as an unsigned big-endian int (0 <= v < 2**64)."""
    if not isinstance(digest, (bytes, bytearray)) or len(digest) < 8:
        raise ValueError(f"expected a digest of at least 8 bytes, got {digest!r}")
    return int.from_bytes(digest, "big") & _U64


def vllm_event_hashes(token_ids: Sequence[int], block_size: int, **options: Any) -> list[int]:
    """`vllm_block_hashes` in the uint64 form vLLM publishes in `block_hashes` (same options)."""
    return [to_event_hash(d) for d in vllm_block_hashes(token_ids, block_size, **options)]


def tagged_extra_keys(
    num_blocks: int,
    *,
    lora_name: str | None = None,
    lora_path: str | None = None,
    cache_salt: str | None = None,
    mm_per_block: Sequence[Sequence[tuple[str, int]]] | None = None,
    prompt_embeds_digest: bytes | None = None,
) -> list[tuple[Any, ...] | None]:
    """vLLM 0.33's tagged hash keys per block, in its order: ("lora", name, path) on every block,
    ("mm", identifier, offset) per pair given for that block, ("cache_salt", salt) on block 0 only,
    ("prompt_embeds", digest) on every block. None for a block with no keys.
    """
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
        raise ValueError(f"num_blocks must be an integer >= 0, got {num_blocks!r}")
    if mm_per_block is not None and len(mm_per_block) < num_blocks:
        raise ValueError(f"mm_per_block has {len(mm_per_block)} entries for {num_blocks} blocks")
    out: list[tuple[Any, ...] | None] = []
    for i in range(num_blocks):
        keys: list[Any] = []
        if lora_name is not None:
            keys.append(("lora", lora_name, lora_path))
        for ident, offset in mm_per_block[i] if mm_per_block is not None else ():
            keys.append(("mm", ident, offset))
        if cache_salt is not None and i == 0:
            keys.append(("cache_salt", cache_salt))
        if prompt_embeds_digest is not None:
            keys.append(("prompt_embeds", prompt_embeds_digest))
        out.append(tuple(keys) if keys else None)
    return out


def untag_extra_keys(tagged: Sequence[Any] | None) -> tuple[Any, ...] | None:
    """One block's tagged keys in the untagged form events carry: lora name, (identifier, offset),
    salt, embeds digest (what vLLM's `to_event_extra_keys` does)."""
    if tagged is None:
        return None
    out: list[Any] = []
    for key in tagged:
        key = _as_tuple(key)
        if not isinstance(key, tuple) or not key:
            raise ValueError(f"not a tagged extra key: {key!r}")
        tag = key[0]
        if tag == "lora" and len(key) >= 2:
            out.append(key[1])
        elif tag == "mm" and len(key) == 3:
            out.append((key[1], key[2]))
        elif tag in ("cache_salt", "prompt_embeds") and len(key) == 2:
            out.append(key[1])
        else:
            raise ValueError(f"unknown tagged extra key: {key!r}")
    return tuple(out) if out else None


def event_extra_keys(tagged_per_block: Sequence[Sequence[Any] | None]) -> list[tuple[Any, ...] | None]:
    """`untag_extra_keys` per block: the `extra_keys` field of a BlockStored."""
    return [untag_extra_keys(t) for t in tagged_per_block]
