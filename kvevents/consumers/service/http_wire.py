"""How the router's HTTP answers reach the socket: TCP_NODELAY, and one write per response.

uvicorn's h11 protocol writes a response as its head, then its body, then an (empty) end. Each
non-empty write is a send() of its own, and on a socket with Nagle's algorithm on, the body waited
for the client's delayed ACK of the head: ~40 ms per keep-alive request (issue 30). TCP_NODELAY on
every accepted connection removes the wait; `OneWrite` also joins the pieces into one send (one
syscall fewer, ~20 us, and nothing left for Nagle to hold back).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

__all__ = ["OneWrite", "set_nodelay"]


def set_nodelay(sock: Any) -> None:
    """TCP_NODELAY on an accepted TCP connection (AF_UNIX and closed sockets are left alone)."""
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the peer already left: connection_lost follows
            pass


class OneWrite:
    """A transport that holds writes until `flush()` (the protocol calls it when a response is
    complete) or the loop's next turn, whichever comes first, then sends them as one; every other
    attribute is the wrapped transport's. close() sends what is held first."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:  # a write with no response end after it (100 Continue, a stream) still leaves
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def flush(self) -> None:
        """Send what is held, as one write."""
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            if not self.transport.is_closing():
                self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self._held.clear()
        self.transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)
