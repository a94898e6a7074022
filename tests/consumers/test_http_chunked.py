"""POST /score without Content-Length: a chunked body is scored (200), one passing the size limit
is refused with 413 as soon as it does (not read to its end), and a body with neither header is 411;
the README says the same."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator

import pytest

from kvevents.consumers.service.core import RouterService
from kvevents.consumers.service.http_api import HttpLimits
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source
from tests.helpers.repo import README


@pytest.fixture(scope="module")
def router() -> Iterator[tuple[str, int]]:
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, bind=True)
    service = RouterService([Source(pub.endpoint, pub.replay_endpoint, "w0")], page_size=16, seed=0)
    service.start()
    try:
        yield service.serve_http("127.0.0.1", 0, HttpLimits(max_body_bytes=4096, body_timeout_s=5.0))
    finally:
        service.stop()
        pub.close()


def _chunked(chunks: list[bytes], end: bool = True) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    return body + (b"0\r\n\r\n" if end else b"")


def _raw(addr: tuple[str, int], head: bytes, body: bytes, timeout: float = 3.0) -> tuple[int, bytes, float]:
    """Send a request by hand; the status, the body and how long the answer took."""
    s = socket.create_connection(addr, timeout=timeout)
    try:
        t0 = time.monotonic()
        s.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) == 0:
            more = s.recv(65536)
            if not more:
                break
            data += more
        elapsed = time.monotonic() - t0
    finally:
        s.close()
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1], elapsed


HEAD = b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_chunked_body_is_scored(router: tuple[str, int]) -> None:
    body = json.dumps({"tokens": list(range(40))}).encode()
    status, answer, _ = _raw(router, HEAD, _chunked([body[:7], body[7:]]))
    assert status == 200 and json.loads(answer)["pages"] == 2


def test_a_chunked_body_past_the_limit_is_413_before_it_ends(router: tuple[str, int]) -> None:
    # 5 KiB against a 4 KiB limit, and the body never ends: the answer comes before the body timeout
    status, answer, took = _raw(router, HEAD, _chunked([b"[" * 1024] * 5, end=False))
    assert status == 413 and "exceeds 4096" in json.loads(answer)["error"]
    assert took < 2.0


def test_neither_length_nor_chunked_is_411_and_the_readme_says_so(router: tuple[str, int]) -> None:
    conn = http.client.HTTPConnection(*router, timeout=5)
    try:
        conn.putrequest("POST", "/score")
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 411 and "Transfer-Encoding: chunked" in json.loads(resp.read())["error"]
    finally:
        conn.close()
    text = " ".join(README.read_text().split())
    assert "**411** neither `Content-Length` nor `Transfer-Encoding: chunked` (a chunked body is taken" in text
