"""Wire constants and endpoint rules of the ZeroMQ transport (schemas/README.md, "Wire format" and "Transport in one page").

One place for frame shapes (seq framing, end marker, request names) and the vLLM endpoint rules
(bind-or-connect, data-parallel port offsets), so publisher and subscriber cannot disagree.
"""

from __future__ import annotations

import re
import struct

__all__ = [
    "SEQ",
    "END_SEQ",
    "SNAPSHOT_SEQ",
    "SNAPSHOT_REQUEST",
    "DESCRIBE_REQUEST",
    "COMMANDS",
    "SCHEMA_VERSION",
    "HASH_SCHEME",
    "pack_seq",
    "unpack_seq",
    "should_bind",
    "offset_endpoint",
    "check_endpoint",
]

SEQ = struct.Struct(">Q")
pack_seq = SEQ.pack

END_SEQ = b"\xff" * 8  # seq frame of the end marker closing a replay or a snapshot
SNAPSHOT_SEQ = b"\xff" * 7 + b"\xfe"  # seq frame of every snapshot batch
SNAPSHOT_REQUEST = b"KVE/SNAPSHOT"
DESCRIBE_REQUEST = b"KVE/DESCRIBE"
COMMANDS = (SNAPSHOT_REQUEST, DESCRIBE_REQUEST)  # never 8 bytes: an 8-byte request is a replay start
if any(len(c) == 8 for c in COMMANDS):  # pragma: no cover - a guard for whoever adds a command
    raise ImportError("a KVE/ command name of 8 bytes would be read as a replay start")
SCHEMA_VERSION = 1
HASH_SCHEME = "sglang-0.5.20/sha256-u32le/int64-be8"


def unpack_seq(frame: bytes) -> int:
    """The seq of an 8-byte big-endian frame; ValueError for any other length."""
    if len(frame) != 8:
        raise ValueError(f"seq frame must be 8 bytes, got {len(frame)}")
    return SEQ.unpack(frame)[0]


def should_bind(endpoint: str, bind: bool | None = None) -> bool:
    """vLLM's rule unless `bind` is explicit: bind wildcards (`*`, `::`, `0.0.0.0`), ipc and inproc."""
    if bind is not None:
        return bool(bind)
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    return "*" in endpoint or "::" in endpoint or "0.0.0.0" in endpoint


_SCHEMES = ("tcp", "ipc", "inproc")


def check_endpoint(endpoint: str) -> str:
    """`endpoint` unchanged if ZeroMQ can use it as written; ValueError naming it otherwise.

    Schemes tcp, ipc, inproc; tcp needs HOST:PORT with PORT `*` or 0..65535 (libzmq would silently
    take a larger port modulo 65536, and bind or connect somewhere else).
    """
    if not isinstance(endpoint, str):
        raise ValueError(f"endpoint {endpoint!r}: expected a string")
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in _SCHEMES or not rest:
        raise ValueError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT, ipc://PATH or inproc://NAME")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host:
            raise ValueError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT")
        if port != "*" and not (port.isascii() and port.isdigit() and int(port) <= 65535):
            raise ValueError(f"endpoint {endpoint!r}: port must be * or an integer in 0..65535, got {port!r}")
    return endpoint


_TCP_PORT = re.compile(r"^(tcp://.*):(\d+)$")


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """The endpoint of data-parallel rank r: tcp port + r, inproc name + `_dp{r}`; rank 0 unchanged.

    An ephemeral port (`*` or 0) is left alone (the OS picks one per rank anyway).
    """
    if dp_rank < 0:
        raise ValueError(f"dp_rank must be >= 0, got {dp_rank}")
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{dp_rank}"
    m = _TCP_PORT.match(endpoint)
    if m is not None:
        port = int(m.group(2))
        if port == 0:
            return endpoint
        if port + dp_rank > 65535:
            raise ValueError(f"endpoint {endpoint!r}: port {port} + dp_rank {dp_rank} exceeds 65535")
        return f"{m.group(1)}:{port + dp_rank}"
    return endpoint
