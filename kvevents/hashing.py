"""The page-hash contract (schemas/README.md, sections "Namespace" to "The published integer"): namespaces, storage and event chains, int64 form.

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
from functools import lru_cache
from typing import Any, Callable, Sequence

from kvevents import native as _native

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
    "whole_pages_chain",
    "packed_to_int64",
    "packed_to_int64_array",
    "check_page_size",
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
    if isinstance(token_ids, (bytes, bytearray, memoryview, str, set, frozenset, dict)):
        raise ValueError(f"token ids must be an ordered sequence of ints, not {type(token_ids).__name__}")
    if getattr(token_ids, "ndim", None) == 0:
        raise ValueError("token ids must be a sequence, not a scalar array")
    if not isinstance(token_ids, (list, tuple, array, range)) and not hasattr(token_ids, "dtype"):
        try:  # one pass over an iterator, so that an error can still name the position
            token_ids = list(token_ids)
        except TypeError:
            raise ValueError(f"token ids must be a sequence of ints, not {type(token_ids).__name__}") from None
    if type(token_ids) is list and _native.active():
        fast = _native.pack_u32(token_ids)
        if fast is not None:  # None: a bad id, named by the Python path below
            return fast
    if isinstance(token_ids, array) and token_ids.typecode in "IL" and token_ids.itemsize == 4:
        packed = token_ids
    elif hasattr(token_ids, "dtype") and hasattr(token_ids, "astype"):  # numpy-like, no import
        return _pack_array_like(token_ids)
    else:
        try:
            if type(token_ids) is list:
                packed = array("I")
                packed.fromlist(token_ids)  # about 2x faster than array("I", list)
            else:
                packed = array("I", token_ids)
        except (OverflowError, TypeError):
            raise _token_error(token_ids) from None
        if packed.itemsize != 4:  # pragma: no cover - platforms with 2-byte unsigned int
            packed = array("L", token_ids)
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        packed = array(packed.typecode, packed)
        packed.byteswap()
    return packed.tobytes()


def _pack_array_like(token_ids: Any) -> bytes:
    """pack_tokens of a numpy-like array (any shape, flattened): integer dtypes range-checked."""
    if token_ids.dtype.kind == "O":
        return pack_tokens(token_ids.reshape(-1).tolist())  # Python ints in a numpy box
    if token_ids.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got dtype {token_ids.dtype}")
    flat = token_ids.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() > TOKEN_ID_MAX):
        raise _token_error(flat.tolist())
    return flat.astype("<u4").tobytes()


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


def check_page_size(page_size: int) -> int:
    """`page_size` if it is an integer >= 1; ValueError otherwise (the one page-size rule)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
    return page_size


_check_page_size = check_page_size


_C_PAGE_MAX = 1 << 20  # larger pages (absurd, but valid) take the pure-Python chain
_BLOCK = 64  # pages / digests unpacked per struct call (a bounded set of cached Structs)


@lru_cache(maxsize=256)
def _page_struct(step: int, count: int) -> struct.Struct:
    return struct.Struct(f"{step}s" * count)


_PUBLISHED = struct.Struct(">q24x")  # the published int64: first 8 bytes of each 32-byte digest


def _pages(data: bytes, page_size: int) -> list[bytes]:
    """Cut packed tokens into page byte strings (the last may be partial), once per sequence."""
    step = page_size * 4
    full = len(data) - len(data) % step
    n = full // step
    view = memoryview(data)
    out: list[bytes] = []
    block = step * _BLOCK
    for off in range(0, full - block + 1, block):
        out.extend(_page_struct(step, _BLOCK).unpack_from(view, off))
    rest = n % _BLOCK
    if rest:
        out.extend(_page_struct(step, rest).unpack_from(view, full - rest * step))
    if full < len(data):
        out.append(data[full:])
    return out


def _digests(pages: Sequence[bytes], prior: bytes | None) -> list[bytes]:
    """The one chain loop: raw 32-byte digests, each the prior of the next page.

    `sha256(prior + page)` on small byte strings is the cheapest form in CPython (one call, one
    short copy); it measured faster than `sha256(prior).update(page)` on memoryview slices.
    """
    if not pages:
        return []
    if type(pages) is list and _native.active():  # the compiled chain: same digests, ~3x faster
        return _native.chain_pages(pages, prior)
    sha = _sha256
    if prior is None:
        prior = sha(pages[0]).digest()
        digests = [prior]
        pages = pages[1:]
    else:
        digests = []
    append = digests.append
    for page in pages:
        prior = sha(prior + page).digest()
        append(prior)
    return digests


def _chain(pages: list[bytes], prior: bytes | None) -> list[str]:
    """Hash pages in order (see `_digests`); hex digests out."""
    return [d.hex() for d in _digests(pages, prior)]


def packed_to_int64(packed: bytes) -> list[int]:
    """Published int64 of each digest in concatenated 32-byte digests (the one digest -> int64 rule:
    the first 8 bytes, big-endian, signed)."""
    return [v for (v,) in _PUBLISHED.iter_unpack(packed)]


def packed_to_int64_array(packed: bytes) -> array:
    """`packed_to_int64` as an array('q'): no int object per digest (numpy reads it with frombuffer)."""
    if _native.active():
        out = array("q")
        out.frombytes(_native.digests_int64(packed))
        return out
    return array("q", packed_to_int64(packed))


def _ints(digests: Sequence[bytes]) -> list[int]:
    """Published int64 of each 32-byte digest."""
    return packed_to_int64(b"".join(digests))


def packed_chain(data: bytes, page_size: int, prior: bytes | None = None) -> bytes:
    """The page chain over packed whole pages (`pack_tokens` output), as concatenated raw digests:
    what the cache keeps per node (32 bytes a page, no object per digest)."""
    if page_size <= _C_PAGE_MAX and _native.active():
        return _native.chain_packed(data, page_size, prior)
    return b"".join(_digests(_pages(data, page_size), prior))


def whole_pages_chain(token_ids: Sequence[int], page_size: int, prior: bytes | None = None) -> bytes:
    """`packed_chain` of the whole pages of `token_ids` (every id validated; a partial tail is not
    hashed): what a router looks up. Compiled, a token list is packed and hashed in one pass."""
    _check_page_size(page_size)
    if type(token_ids) is list and page_size <= _C_PAGE_MAX and _native.active():
        out = _native.chain_list(token_ids, page_size, prior)
        if out is not None:  # None: a bad id, named by pack_tokens below
            return out
    packed = pack_tokens(token_ids)
    return packed_chain(packed[: len(packed) - len(packed) % (4 * page_size)], page_size, prior)


def page_hashes(token_ids: Sequence[int], page_size: int, prior: str | None = None) -> list[str]:
    """The plain page chain: one 64-char hex digest per page (last page may be partial)."""
    _check_page_size(page_size)
    return _chain(_pages(pack_tokens(token_ids), page_size), _prior_bytes(prior))


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
    _check_page_size(page_size)
    data = pack_tokens(token_ids)
    seed = _prior_bytes(prior)
    if seed is None:
        seed = _prior_bytes(seed_of(namespace))
    else:
        _as_namespace(namespace)
    return _pages(data, page_size), seed


def storage_hashes(
    token_ids: Sequence[int], page_size: int, namespace: Namespace | None, prior: str | None = None
) -> list[str]:
    """Storage chain: a head (prior None or "") is seeded by the full namespace; continuations are not."""
    return _chain(*_pages_and_seed(token_ids, page_size, namespace, prior, storage_seed))


def event_hashes(
    token_ids: Sequence[int], page_size: int, namespace: Namespace | None, prior: str | None = None
) -> list[str]:
    """Event (published) chain: a head is seeded by cache_salt only; continuations are not."""
    return _chain(*_pages_and_seed(token_ids, page_size, namespace, prior, event_seed))


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
    _check_page_size(page_size)
    data = pack_tokens(token_ids)
    s_seed = _prior_bytes(storage_prior)
    if s_seed is None:
        s_seed = _prior_bytes(storage_seed(namespace))
    e_seed = _prior_bytes(event_prior)
    if e_seed is None:
        e_seed = _prior_bytes(event_seed(namespace))
    else:
        _as_namespace(namespace)
    pages = _pages(data, page_size)
    storage = _chain(pages, s_seed)
    if e_seed == s_seed:
        return storage, list(storage)
    return storage, _chain(pages, e_seed)


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


# ---------------------------------------------------------------- int64 fast path (no hex round trip)


def split_pages(packed: bytes, page_size: int) -> list[bytes]:
    """Packed tokens (`pack_tokens`) cut into page byte strings; the last may be partial."""
    _check_page_size(page_size)
    if not isinstance(packed, (bytes, bytearray, memoryview)):
        raise ValueError(f"packed tokens must be bytes, got {type(packed).__name__}")
    packed = bytes(packed)
    if len(packed) % 4:
        raise ValueError(f"packed tokens must be a multiple of 4 bytes, got {len(packed)}")
    return _pages(packed, page_size)


def digest_chain(pages: Sequence[bytes], prior: bytes | None = None) -> list[bytes]:
    """Raw 32-byte digests of a page chain (schemas/README.md, "The page hash"); `prior` is the previous raw digest or None.

    The same chain as `page_hashes` & co. (one implementation); continue a chain by passing the
    last digest of the previous call as `prior`.
    """
    if prior is not None and (not isinstance(prior, bytes) or len(prior) != 32):
        raise ValueError(f"prior must be a 32-byte digest or None, got {prior!r}")
    try:
        return _digests(pages, prior)
    except TypeError:
        raise ValueError("pages must be a sequence of bytes") from None


def digests_to_int64(digests: Sequence[bytes]) -> list[int]:
    """Published int64 of each raw digest: its first 8 bytes read big-endian, signed (as `to_int64`)."""
    if isinstance(digests, (bytes, bytearray, str)):
        raise ValueError(f"digests must be a sequence of 32-byte digests, not {type(digests).__name__}")
    try:
        ok = set(map(len, digests)) <= {32}  # C-level: a few us for 512 digests
    except TypeError:
        ok = False
    if not ok:
        if not hasattr(digests, "__iter__"):
            raise ValueError(f"digests must be a sequence of 32-byte digests, not {type(digests).__name__}")
        for pos, d in enumerate(digests):
            if not isinstance(d, bytes) or len(d) != 32:
                raise ValueError(f"digest at position {pos} is not 32 bytes: {d!r}")
    try:
        return _ints(digests)
    except TypeError:
        raise ValueError("digests must be bytes") from None


def event_hashes_int64(
    token_ids: Sequence[int], page_size: int, namespace: Namespace | None, prior: str | None = None
) -> list[int]:
    """`[to_int64(h) for h in event_hashes(...)]`, without the hex round trip (~1.7x faster)."""
    return _ints(_digests(*_pages_and_seed(token_ids, page_size, namespace, prior, event_seed)))
