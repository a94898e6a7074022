"""CRC-32 arithmetic that lets a reader check any byte range from prefix CRCs (zlib's polynomial).

For bytes A then B, zlib's CRC obeys crc(A+B) = zeros(crc(A), len(B)) ^ crc(B), where `zeros` is a
linear map over GF(2): the effect of len(B) zero bytes on the CRC register (this is what zlib's
crc32_combine computes). So crc(B) = crc(A+B) ^ zeros(crc(A), len(B)): with the CRC of every
prefix known, the CRC of any range costs one `zeros`, not a pass over the range. The map for
2**k bytes is kept as four byte-indexed tables; a length is the product of its set bits' maps.
"""

from __future__ import annotations

__all__ = ["zeros", "range_crc"]

_POLY = 0xEDB88320  # zlib's CRC-32, bit-reflected
_MAX_BITS = 33  # lengths below 2**33 bytes (a record body is at most 256 MiB)
_Tables = tuple[list[int], list[int], list[int], list[int]]


def _one_zero_byte(reg: int) -> int:
    """The raw register after one zero byte (no pre/post conditioning: that part cancels)."""
    for _ in range(8):
        reg = (reg >> 1) ^ (_POLY if reg & 1 else 0)
    return reg


def _tables(columns: list[int]) -> _Tables:
    """Byte-sliced tables of the linear map whose image of bit i is columns[i]."""
    out: list[list[int]] = []
    for byte in range(4):
        t = [0] * 256
        for v in range(1, 256):
            low = v & -v
            t[v] = t[v ^ low] ^ columns[8 * byte + low.bit_length() - 1]
        out.append(t)
    return out[0], out[1], out[2], out[3]


def _apply(t: _Tables, v: int) -> int:
    return t[0][v & 0xFF] ^ t[1][(v >> 8) & 0xFF] ^ t[2][(v >> 16) & 0xFF] ^ t[3][v >> 24]


def _powers() -> list[_Tables]:
    """Tables of the map for 2**k zero bytes, k = 0 .. _MAX_BITS - 1 (built once, ~32k ints)."""
    cols = [_one_zero_byte(1 << i) for i in range(32)]
    out = [_tables(cols)]
    for _ in range(1, _MAX_BITS):
        prev = out[-1]
        out.append(_tables([_apply(prev, _apply(prev, 1 << i)) for i in range(32)]))
    return out


_POWERS: list[_Tables] = []  # built on first use (~6 ms), not at import
_CACHE: dict[int, _Tables] = {}  # whole-length maps for lengths seen often (false markers repeat one claim)
_SEEN: dict[int, int] = {}
_CACHE_AFTER = 256  # uses of one length before its own tables (~1 ms to build) pay off
_CACHE_MAX = 32


def zeros(crc: int, length: int) -> int:
    """The CRC of (the bytes behind `crc`) + `length` zero bytes, minus the CRC of those zeros."""
    if not 0 <= length < 1 << _MAX_BITS:
        raise ValueError(f"length {length} out of range")
    t = _CACHE.get(length)
    if t is not None:
        return _apply(t, crc)
    seen = _SEEN.get(length, 0) + 1
    if seen >= _CACHE_AFTER and len(_CACHE) < _CACHE_MAX:
        t = _tables([_generic(1 << i, length) for i in range(32)])
        _CACHE[length] = t
        _SEEN.pop(length, None)
        return _apply(t, crc)
    if len(_SEEN) >= 4096:
        _SEEN.clear()
    _SEEN[length] = seen
    return _generic(crc, length)


def _generic(crc: int, length: int) -> int:
    """The map for `length` as the product of its set bits' maps (about 10 table rounds for 2 MB)."""
    if not _POWERS:
        _POWERS.extend(_powers())
    k = 0
    while length and crc:
        if length & 1:
            t0, t1, t2, t3 = _POWERS[k]
            crc = t0[crc & 0xFF] ^ t1[(crc >> 8) & 0xFF] ^ t2[(crc >> 16) & 0xFF] ^ t3[crc >> 24]
        length >>= 1
        k += 1
    return crc


def range_crc(prefix_a: int, prefix_b: int, length: int) -> int:
    """zlib.crc32 of the `length` bytes between two prefixes whose CRCs are prefix_a and prefix_b."""
    return prefix_b ^ zeros(prefix_a, length)
