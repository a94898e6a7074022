"""The benchmarks' HTTP/1.1 client: one kept-alive connection, a request in one write, one full
answer (Content-Length) read back. Used by bench_http.py and bench_http_abuse.py."""

from __future__ import annotations

import socket

__all__ = ["Conn"]


class Conn:
    """One client connection to 127.0.0.1:port with TCP_NODELAY; `roundtrip` returns the status."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def roundtrip(self, req: bytes) -> int:
        self.sock.sendall(req)
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            self._fill()
        head, self.buf = self.buf[:end].decode("latin-1"), self.buf[end + 4 :]
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        while len(self.buf) < length:
            self._fill()
        self.buf = self.buf[length:]
        return int(head.split(" ", 2)[1])

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("closed mid-answer")
        self.buf += chunk

    def close(self) -> None:
        self.sock.close()
