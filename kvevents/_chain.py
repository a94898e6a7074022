"""The page chain's speed plumbing behind kvevents.hashing (private: hashing.py states the contract).

Token packing with its fast paths, pages cut with cached Structs, the one chain loop over raw
digests, the digest -> int64 rule in bulk, and the compiled twins picked by kvevents.native. The
raw-digest functions (split_pages ... whole_pages_chain) are public through kvevents.hashing.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from kvevents import native as _native

__all__ = [
    "TOKEN_ID_MAX",
    "check_page_size",
    "pack",
    "cut_pages",
    "chain_digests",
    "hex_chain",
    "published_ints",
    "split_pages",
    "digest_chain",
    "digests_to_int64",
    "packed_chain",
    "packed_chain_int64",
    "whole_pages_chain",
    "whole_pages_int64",
    "packed_to_int64",
    "packed_to_int64_array",
]

TOKEN_ID_MAX = 2**32 - 1  # token ids are packed as uint32

_sha256 = hashlib.sha256
_LITTLE = sys.byteorder == "little"
_C_PAGE_MAX = 1 << 20  # larger pages (absurd, but valid) take the pure-Python chain
_BLOCK = 64  # pages / digests unpacked per struct call (a bounded set of cached Structs)
_PUBLISHED = struct.Struct(">q24x")  # the published int64: first 8 bytes of each 32-byte digest


def check_page_size(page_size: int) -> int:
    """`page_size` if it is an integer >= 1; ValueError otherwise (the one page-size rule)."""
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size must be an integer >= 1, got {page_size!r}")
    return page_size


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


def _as_sequence(token_ids: Any) -> Any:
    """Refuse unordered or scalar inputs; an iterator becomes a list (one pass, positions kept)."""
    if isinstance(token_ids, (bytes, bytearray, memoryview, str, set, frozenset, dict)):
        raise ValueError(f"token ids must be an ordered sequence of ints, not {type(token_ids).__name__}")
    if getattr(token_ids, "ndim", None) == 0:
        raise ValueError("token ids must be a sequence, not a scalar array")
    if not isinstance(token_ids, (list, tuple, array, range)) and not hasattr(token_ids, "dtype"):
        try:  # one pass over an iterator, so that an error can still name the position
            return list(token_ids)
        except TypeError:
            raise ValueError(f"token ids must be a sequence of ints, not {type(token_ids).__name__}") from None
    return token_ids


def _pack_numpy(token_ids: Any) -> bytes:
    """A numpy-like integer array (no numpy import): range-checked, then cast to <u4."""
    if token_ids.dtype.kind == "O":
        return pack(token_ids.reshape(-1).tolist())  # Python ints in a numpy box
    if token_ids.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got dtype {token_ids.dtype}")
    flat = token_ids.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() > TOKEN_ID_MAX):
        raise _token_error(flat.tolist())
    return flat.astype("<u4").tobytes()


def pack(token_ids: Any) -> bytes:
    """kvevents.hashing.pack_tokens: little-endian uint32 bytes, the compiled packer for lists."""
    if type(token_ids) is list and _native.active():
        fast = _native.pack_u32(token_ids)
        if fast is not None:  # None: a bad id, named by the Python path below
            return fast
    token_ids = _as_sequence(token_ids)
    if isinstance(token_ids, array) and token_ids.typecode in "IL" and token_ids.itemsize == 4:
        packed = token_ids
    elif hasattr(token_ids, "dtype") and hasattr(token_ids, "astype"):
        return _pack_numpy(token_ids)
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


@lru_cache(maxsize=256)
def _page_struct(step: int, count: int) -> struct.Struct:
    return struct.Struct(f"{step}s" * count)


def cut_pages(data: bytes, page_size: int) -> list[bytes]:
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


def chain_digests(pages: Sequence[bytes], prior: bytes | None) -> list[bytes]:
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


def hex_chain(pages: list[bytes], prior: bytes | None) -> list[str]:
    """Hash pages in order (see `chain_digests`); hex digests out."""
    return [d.hex() for d in chain_digests(pages, prior)]


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


def published_ints(digests: Sequence[bytes]) -> list[int]:
    """Published int64 of each 32-byte digest."""
    return packed_to_int64(b"".join(digests))


def packed_chain(data: bytes, page_size: int, prior: bytes | None = None) -> bytes:
    """The page chain over packed whole pages (`pack_tokens` output), as concatenated raw digests:
    what the cache keeps per node (32 bytes a page, no object per digest)."""
    if page_size <= _C_PAGE_MAX and _native.active():
        return _native.chain_packed(data, page_size, prior)
    return b"".join(chain_digests(cut_pages(data, page_size), prior))


def whole_pages_chain(token_ids: Sequence[int], page_size: int, prior: bytes | None = None) -> bytes:
    """`packed_chain` of the whole pages of `token_ids` (every id validated; a partial tail is not
    hashed): what a router looks up. Compiled, a token list is packed and hashed in one pass."""
    check_page_size(page_size)
    if type(token_ids) is list and page_size <= _C_PAGE_MAX and _native.active():
        out = _native.chain_list(token_ids, page_size, prior)
        if out is not None:  # None: a bad id, named by pack below
            return out
    packed = pack(token_ids)
    return packed_chain(packed[: len(packed) - len(packed) % (4 * page_size)], page_size, prior)


def packed_chain_int64(data: bytes, page_size: int, prior: bytes | None = None) -> bytes:
    """The published int64 of each page of `packed_chain`, as native int64 bytes (no digest kept)."""
    if page_size <= _C_PAGE_MAX and _native.active():
        return _native.chain_packed(data, page_size, prior, True)
    return packed_to_int64_array(packed_chain(data, page_size, prior)).tobytes()


def whole_pages_int64(token_ids: Sequence[int], page_size: int, prior: bytes | None = None) -> bytes:
    """The published int64 of each page of `whole_pages_chain`, as native int64 bytes."""
    check_page_size(page_size)
    if type(token_ids) is list and page_size <= _C_PAGE_MAX and _native.active():
        out = _native.chain_list(token_ids, page_size, prior, True)
        if out is not None:  # None: a bad id, named by pack below
            return out
    return packed_to_int64_array(whole_pages_chain(token_ids, page_size, prior)).tobytes()


def split_pages(packed: bytes, page_size: int) -> list[bytes]:
    """Packed tokens (`pack_tokens`) cut into page byte strings; the last may be partial."""
    check_page_size(page_size)
    if not isinstance(packed, (bytes, bytearray, memoryview)):
        raise ValueError(f"packed tokens must be bytes, got {type(packed).__name__}")
    packed = bytes(packed)
    if len(packed) % 4:
        raise ValueError(f"packed tokens must be a multiple of 4 bytes, got {len(packed)}")
    return cut_pages(packed, page_size)


def digest_chain(pages: Sequence[bytes], prior: bytes | None = None) -> list[bytes]:
    """Raw 32-byte digests of a page chain (schemas/README.md, "The page hash"); `prior` is the previous raw digest or None.

    The same chain as `page_hashes` & co. (one implementation); continue a chain by passing the
    last digest of the previous call as `prior`.
    """
    if prior is not None and (not isinstance(prior, bytes) or len(prior) != 32):
        raise ValueError(f"prior must be a 32-byte digest or None, got {prior!r}")
    try:
        return chain_digests(pages, prior)
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
        return published_ints(digests)
    except TypeError:
        raise ValueError("digests must be bytes") from None
