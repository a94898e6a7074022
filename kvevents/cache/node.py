"""Radix node and the small helpers the cache is built from (digest chains, validation).

A node's hashes are kept packed: one bytes object of 32-byte digests per chain, in page order,
which costs 32 bytes per page instead of a Python object per digest.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from typing import Any

from kvevents.hashing import DEFAULT_NAMESPACE, Namespace

__all__ = ["Node", "DIGEST", "digests", "published", "published_one", "hexes", "tokens_of", "as_namespace", "check_opt_str", "check_count"]

DIGEST = 32
_sha256 = hashlib.sha256
_PUB = struct.Struct(">q24x")
_PUB1 = struct.Struct(">q")  # the published int64: first 8 bytes of each 32-byte digest
_LITTLE = struct.pack("=I", 1) == b"\x01\x00\x00\x00"


def digests(data: bytes, step: int, prior: bytes | None) -> bytes:
    """SPEC section 2 chain over pre-packed whole pages, as concatenated raw digests."""
    out = bytearray()
    view = memoryview(data)
    for off in range(0, len(data), step):
        h = _sha256(prior) if prior is not None else _sha256()
        h.update(view[off : off + step])
        prior = h.digest()
        out += prior
    return bytes(out)


def published_one(digest: bytes) -> int:
    """Published int64 of one digest (its first 8 bytes, big-endian, signed)."""
    return int(_PUB1.unpack_from(digest)[0])


def published(packed: bytes) -> list[int]:
    """Published int64 of every digest in a packed chain."""
    return [v for (v,) in _PUB.iter_unpack(packed)]


def hexes(packed: bytes) -> list[str]:
    """Hex form of every digest in a packed chain."""
    return [packed[i : i + DIGEST].hex() for i in range(0, len(packed), DIGEST)]


def tokens_of(data: bytes) -> list[int]:
    """Token ids of packed little-endian uint32 pages."""
    if _LITTLE:
        arr = array("I")
        if arr.itemsize == 4:
            arr.frombytes(data)
            return arr.tolist()
    return list(struct.unpack(f"<{len(data) // 4}I", data))  # pragma: no cover - exotic hosts


def as_namespace(namespace: Any) -> Namespace:
    if namespace is None:
        return DEFAULT_NAMESPACE
    if not isinstance(namespace, Namespace):
        raise ValueError(f"namespace must be a kvevents.hashing.Namespace, got {type(namespace).__name__}")
    return namespace


def check_opt_str(value: Any, what: str) -> None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what} must be a str or None, got {type(value).__name__}")


def check_count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {value!r}")
    return value


class Node:
    """One radix node: a run of whole pages under one namespace."""

    __slots__ = (
        "parent", "children", "data", "ns", "storage", "events", "content", "last_access", "lock", "alive", "serial",
        "lora_name",
    )

    def __init__(self, serial: int = 0) -> None:
        self.parent: Node | None = None
        self.children: dict[Any, Node] = {}
        self.data = b""  # packed uint32 tokens of this node's pages
        self.ns = DEFAULT_NAMESPACE
        self.storage = b""  # packed storage digests
        self.events: bytes | None = None  # packed event digests; None when they equal storage
        self.content: list[bytes] | None = None  # simulated KV bytes per page (sim only)
        self.last_access = 0
        self.lock = 0
        self.alive = True
        self.serial = serial
        self.lora_name: str | None = None  # the adapter its BlockStored named: its BlockRemoved names it too

    def ev(self) -> bytes:
        """Packed event digests (the storage ones in the default namespace)."""
        return self.storage if self.events is None else self.events

    @property
    def pages(self) -> int:
        return len(self.storage) // DIGEST
