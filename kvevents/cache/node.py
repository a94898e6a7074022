"""Radix node and the small helpers the cache is built from (digest chains, validation).

A node's hashes are kept packed: one bytes object of 32-byte digests per chain, in page order,
which costs 32 bytes per page instead of a Python object per digest.
"""

from __future__ import annotations

import struct
from array import array
from typing import Any

from kvevents.hashing import DEFAULT_NAMESPACE, Namespace, packed_chain, packed_to_int64

__all__ = [
    "Node",
    "DIGEST",
    "digests",
    "published",
    "published_one",
    "hexes",
    "tokens_of",
    "as_namespace",
    "check_opt_str",
    "check_count",
]

DIGEST = 32
_LITTLE = struct.pack("=I", 1) == b"\x01\x00\x00\x00"


def digests(data: bytes, step: int, prior: bytes | None) -> bytes:
    """The page chain over pre-packed whole pages of `step` bytes, as concatenated raw digests."""
    return packed_chain(data, step // 4, prior)


def published_one(digest: bytes) -> int:
    """Published int64 of one digest."""
    return packed_to_int64(digest[:DIGEST])[0]


def published(packed: bytes) -> list[int]:
    """Published int64 of every digest in a packed chain."""
    return packed_to_int64(packed)


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
        "parent",
        "children",
        "data",
        "ns",
        "storage",
        "events",
        "content",
        "last_access",
        "lock",
        "alive",
        "serial",
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
