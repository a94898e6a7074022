"""The page-hash contract (schemas/README.md, sections "Namespace" to "The published integer"): namespaces, storage and event chains, int64 form.

Storage hashes key KV pages by the full namespace (extra_key + cache_salt); event hashes, the
ones published to routers and indexers, are seeded by cache_salt alone so adapters never move
them. Pure standard library: this module is the part other languages reimplement. Its speed
plumbing (packing fast paths, page cutting, the one chain loop, the compiled twins) is
kvevents/_chain.py; the raw-digest functions there are public from here.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvevents import _chain

# The raw-digest fast path (kvevents/_chain.py), public here: importers keep these paths.
from kvevents._chain import (
    TOKEN_ID_MAX,
    check_page_size,
    digest_chain,
    digests_to_int64,
    packed_chain,
    packed_chain_int64,
    packed_to_int64,
    packed_to_int64_array,
    split_pages,
    whole_pages_chain,
    whole_pages_int64,
)

__all__ = [
    "Namespace",
    "DEFAULT_NAMESPACE",
    "TOKEN_ID_MAX",
    "pack_tokens",
    "page_hashes",
    "storage_seed",
    "event_seed",
    "storage_hashes",
    "event_hashes",
    "hash_chains",
    "to_int64",
    "int64_to_hex16",
    "split_pages",
    "digest_chain",
    "digests_to_int64",
    "event_hashes_int64",
    "packed_chain",
    "packed_chain_int64",
    "whole_pages_chain",
    "whole_pages_int64",
    "packed_to_int64",
    "packed_to_int64_array",
    "check_page_size",
]

STORAGE_SEED_DOMAIN = b"sglang-cache-namespace-v1"
EVENT_SEED_DOMAIN = b"sglang-cache-salt-v1"

_sha256 = hashlib.sha256
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Namespace:
    """A request's cache namespace: pages of different namespaces are never shared.

    `cache_salt` "" normalises to None; `extra_key` "" is kept (a namespace distinct from None).
    """

    extra_key: str | None = None
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        for name in ("extra_key", "cache_salt"):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, str):
                raise ValueError(f"Namespace.{name} must be a str or None, got {type(value).__name__}")
            try:
                value.encode("utf-8")  # hashed as UTF-8: reject lone surrogates here, not mid-insert
            except UnicodeEncodeError as exc:
                raise ValueError(
                    f"Namespace.{name} is not valid UTF-8 text: {exc.reason} at index {exc.start}"
                ) from None
        if self.cache_salt == "":
            object.__setattr__(self, "cache_salt", None)

    @property
    def is_default(self) -> bool:
        """True for (None, None): storage and event chains coincide and nothing is seeded."""
        return self.extra_key is None and self.cache_salt is None


DEFAULT_NAMESPACE = Namespace()


def pack_tokens(token_ids: Any) -> bytes:
    """Pack token ids once as little-endian uint32 (schemas/README.md, "The page hash"); ids outside
    0..TOKEN_ID_MAX, floats, and unordered inputs raise ValueError naming the first bad one."""
    return _chain.pack(token_ids)


def _prior_bytes(prior: str | None) -> bytes | None:
    if prior is None or prior == "":
        return None
    if not isinstance(prior, str) or len(prior) != 64:
        raise ValueError(f"prior must be 64 lowercase hex chars (a SHA-256 digest), got {prior!r}")
    try:
        raw = bytes.fromhex(prior)
    except ValueError:
        raise ValueError(f"prior is not hex: {prior!r}") from None
    if len(raw) != 32:  # fromhex skips whitespace
        raise ValueError(f"prior is not hex: {prior!r}")
    return raw


def page_hashes(token_ids: Sequence[int], page_size: int, prior: str | None = None) -> list[str]:
    """The plain page chain: one 64-char hex digest per page (last page may be partial)."""
    check_page_size(page_size)
    return _chain.hex_chain(_chain.cut_pages(pack_tokens(token_ids), page_size), _prior_bytes(prior))


def _field(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8")
    return b"\x01" + _U64.pack(len(raw)) + raw


def _as_namespace(namespace: Namespace | None) -> Namespace:
    if namespace is None:
        return DEFAULT_NAMESPACE
    if not isinstance(namespace, Namespace):
        raise ValueError(f"namespace must be a kvevents.Namespace, got {type(namespace).__name__}")
    return namespace


def storage_seed(namespace: Namespace | None) -> str | None:
    """Seed of storage chains: SHA-256 of the domain tag and the length-framed namespace fields."""
    ns = _as_namespace(namespace)
    if ns.is_default:
        return None
    return _sha256(STORAGE_SEED_DOMAIN + _field(ns.extra_key) + _field(ns.cache_salt)).hexdigest()


def event_seed(namespace: Namespace | None) -> str | None:
    """Seed of published chains: depends on cache_salt only, never on extra_key."""
    ns = _as_namespace(namespace)
    if ns.cache_salt is None:
        return None
    return _sha256(EVENT_SEED_DOMAIN + b"\x00" + ns.cache_salt.encode("utf-8")).hexdigest()


def _pages_and_seed(
    token_ids: Sequence[int],
    page_size: int,
    namespace: Namespace | None,
    prior: str | None,
    seed_of: Callable[[Namespace | None], str | None],
) -> tuple[list[bytes], bytes | None]:
    """Validate, pack once and cut pages; a chain head (no prior) takes the namespace seed."""
    check_page_size(page_size)
    data = pack_tokens(token_ids)
    seed = _prior_bytes(prior)
    if seed is None:
        seed = _prior_bytes(seed_of(namespace))
    else:
        _as_namespace(namespace)
    return _chain.cut_pages(data, page_size), seed


def storage_hashes(
    token_ids: Sequence[int], page_size: int, namespace: Namespace | None, prior: str | None = None
) -> list[str]:
    """Storage chain: a head (prior None or "") is seeded by the full namespace; continuations are not."""
    return _chain.hex_chain(*_pages_and_seed(token_ids, page_size, namespace, prior, storage_seed))


def event_hashes(
    token_ids: Sequence[int], page_size: int, namespace: Namespace | None, prior: str | None = None
) -> list[str]:
    """Event (published) chain: a head is seeded by cache_salt only; continuations are not."""
    return _chain.hex_chain(*_pages_and_seed(token_ids, page_size, namespace, prior, event_seed))


def hash_chains(
    token_ids: Sequence[int],
    page_size: int,
    namespace: Namespace | None,
    storage_prior: str | None = None,
    event_prior: str | None = None,
) -> tuple[list[str], list[str]]:
    """Both chains at once: `(storage_hashes, event_hashes)`, packing the tokens a single time.

    Same results as the two separate calls; when both chains start from the same prior (the
    default namespace, or equal explicit priors) the chain is computed once and copied.
    """
    check_page_size(page_size)
    data = pack_tokens(token_ids)
    s_seed = _prior_bytes(storage_prior)
    if s_seed is None:
        s_seed = _prior_bytes(storage_seed(namespace))
    e_seed = _prior_bytes(event_prior)
    if e_seed is None:
        e_seed = _prior_bytes(event_seed(namespace))
    else:
        _as_namespace(namespace)
    pages = _chain.cut_pages(data, page_size)
    storage = _chain.hex_chain(pages, s_seed)
    if e_seed == s_seed:
        return storage, list(storage)
    return storage, _chain.hex_chain(pages, e_seed)


def to_int64(hex_hash: str) -> int:
    """Published integer: the first 8 digest bytes read big-endian as a signed int64."""
    if not isinstance(hex_hash, str) or len(hex_hash) < 16:
        raise ValueError(f"expected a hex digest of at least 16 chars, got {hex_hash!r}")
    try:
        raw = bytes.fromhex(hex_hash[:16])
    except ValueError:
        raw = b""
    if len(raw) != 8:  # fromhex skips whitespace: "00 00 ..." must not read fewer bytes
        raise ValueError(f"not a hex digest: {hex_hash!r}")
    return int.from_bytes(raw, "big", signed=True)


def int64_to_hex16(value: int) -> str:
    """The 16 hex chars of a published integer's unsigned 64-bit pattern (for display)."""
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{value} is not a signed 64-bit integer")
    return (value & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big").hex()


def event_hashes_int64(
    token_ids: Sequence[int], page_size: int, namespace: Namespace | None, prior: str | None = None
) -> list[int]:
    """`[to_int64(h) for h in event_hashes(...)]`, without the hex round trip (~1.7x faster)."""
    return _chain.published_ints(
        _chain.chain_digests(*_pages_and_seed(token_ids, page_size, namespace, prior, event_seed))
    )
