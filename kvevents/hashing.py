"""The page-hash contract (SPEC sections 1-4): namespaces, storage and event chains, int64 form.

Storage hashes key KV pages by the full namespace (extra_key + cache_salt); event hashes, the
ones published to routers and indexers, are seeded by cache_salt alone so adapters never move
them. Pure standard library: this module is the part other languages reimplement.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Any, Sequence

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
    "to_int64",
    "int64_to_hex16",
]

TOKEN_ID_MAX = 2**32 - 1
STORAGE_SEED_DOMAIN = b"sglang-cache-namespace-v1"
EVENT_SEED_DOMAIN = b"sglang-cache-salt-v1"

_sha256 = hashlib.sha256
_LITTLE = sys.byteorder == "little"
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Namespace:
    """A request's cache namespace: pages of different namespaces are never shared.

    `cache_salt` "" normalises to None; `extra_key` "" is kept (a namespace distinct from None).
    """

    extra_key: str | None = None
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if self.extra_key is not None and not isinstance(self.extra_key, str):
            raise ValueError(f"Namespace.extra_key must be a str or None, got {type(self.extra_key).__name__}")
        if self.cache_salt is not None and not isinstance(self.cache_salt, str):
            raise ValueError(f"Namespace.cache_salt must be a str or None, got {type(self.cache_salt).__name__}")
        if self.cache_salt == "":
            object.__setattr__(self, "cache_salt", None)

    @property
    def is_default(self) -> bool:
        """True for (None, None): storage and event chains coincide and nothing is seeded."""
        return self.extra_key is None and self.cache_salt is None


DEFAULT_NAMESPACE = Namespace()


def _first_bad_token(token_ids: Any) -> tuple[int, Any]:
    for pos, tok in enumerate(token_ids):
        try:
            ok = 0 <= tok <= TOKEN_ID_MAX and int(tok) == tok
        except TypeError:
            ok = False
        if not ok or isinstance(tok, float):
            return pos, tok
    return -1, None


def _token_error(token_ids: Any) -> ValueError:
    pos, tok = _first_bad_token(token_ids)
    if pos < 0:  # pragma: no cover - only reached if packing failed for another reason
        return ValueError("token ids could not be packed as unsigned 32-bit integers")
    return ValueError(f"token id {tok!r} at position {pos} is not an integer in 0..{TOKEN_ID_MAX}")


def pack_tokens(token_ids: Any) -> bytes:
    """Pack token ids once as little-endian uint32; out-of-range ids raise ValueError naming them."""
    if isinstance(token_ids, (bytes, bytearray, memoryview, str)):
        raise ValueError(f"token ids must be a sequence of ints, not {type(token_ids).__name__}")
    if isinstance(token_ids, array) and token_ids.typecode in "IL" and token_ids.itemsize == 4:
        packed = token_ids
    elif hasattr(token_ids, "dtype") and hasattr(token_ids, "astype"):  # numpy-like, no import
        if token_ids.dtype.kind not in "iu":
            raise ValueError(f"token ids must be integers, got dtype {token_ids.dtype}")
        flat = token_ids.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() > TOKEN_ID_MAX):
            raise _token_error(flat.tolist())
        return flat.astype("<u4").tobytes()
    else:
        try:
            packed = array("I", token_ids)
        except (OverflowError, TypeError):
            raise _token_error(token_ids) from None
        if packed.itemsize != 4:  # pragma: no cover - platforms with 2-byte unsigned int
            packed = array("L", token_ids)
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        packed = array(packed.typecode, packed)
        packed.byteswap()
    return packed.tobytes()


def _prior_bytes(prior: str | None) -> bytes | None:
    if prior is None or prior == "":
        return None
    if not isinstance(prior, str) or len(prior) != 64:
        raise ValueError(f"prior must be 64 lowercase hex chars (a SHA-256 digest), got {prior!r}")
    try:
        return bytes.fromhex(prior)
    except ValueError:
        raise ValueError(f"prior is not hex: {prior!r}") from None


def _check_page_size(page_size: int) -> None:
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")


def _chain(data: bytes, page_size: int, prior: bytes | None) -> list[str]:
    """Hash pre-packed uint32 tokens page by page, each digest the prior of the next."""
    view = memoryview(data)
    step = page_size * 4
    out: list[str] = []
    append = out.append
    sha = _sha256
    for off in range(0, len(view), step):
        h = sha(prior) if prior is not None else sha()
        h.update(view[off : off + step])
        prior = h.digest()
        append(prior.hex())
    return out


def page_hashes(token_ids: Sequence[int], page_size: int, prior: str | None = None) -> list[str]:
    """The plain page chain: one 64-char hex digest per page (last page may be partial)."""
    _check_page_size(page_size)
    return _chain(pack_tokens(token_ids), page_size, _prior_bytes(prior))


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


def storage_hashes(
    token_ids: Sequence[int], page_size: int, namespace: Namespace | None, prior: str | None = None
) -> list[str]:
    """Storage chain: a head (prior None or "") is seeded by the full namespace; continuations are not."""
    _check_page_size(page_size)
    data = pack_tokens(token_ids)
    seed = _prior_bytes(prior)
    if seed is None:
        seed = _prior_bytes(storage_seed(namespace))
    else:
        _as_namespace(namespace)
    return _chain(data, page_size, seed)


def event_hashes(
    token_ids: Sequence[int], page_size: int, namespace: Namespace | None, prior: str | None = None
) -> list[str]:
    """Event (published) chain: a head is seeded by cache_salt only; continuations are not."""
    _check_page_size(page_size)
    data = pack_tokens(token_ids)
    seed = _prior_bytes(prior)
    if seed is None:
        seed = _prior_bytes(event_seed(namespace))
    else:
        _as_namespace(namespace)
    return _chain(data, page_size, seed)


def to_int64(hex_hash: str) -> int:
    """Published integer: the first 8 digest bytes read big-endian as a signed int64."""
    if not isinstance(hex_hash, str) or len(hex_hash) < 16:
        raise ValueError(f"expected a hex digest of at least 16 chars, got {hex_hash!r}")
    try:
        return int.from_bytes(bytes.fromhex(hex_hash[:16]), "big", signed=True)
    except ValueError:
        raise ValueError(f"not a hex digest: {hex_hash!r}") from None


def int64_to_hex16(value: int) -> str:
    """The 16 hex chars of a published integer's unsigned 64-bit pattern (for display)."""
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{value} is not a signed 64-bit integer")
    return (value & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big").hex()
