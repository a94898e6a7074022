"""The README's "Using the library" snippet runs as pasted (only its two ports swapped for free ones)
and publishes what a subscriber receives."""

from __future__ import annotations

import re
import socket

import zmq

from tests.helpers.repo import README


def _snippet() -> str:
    section = README.read_text().split("## Using the library", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_the_library_snippet_runs_as_pasted() -> None:
    code = _snippet()
    assert "prompt_ids =" in code and "pub.close()" in code  # defines its prompt, closes its publisher
    live, replay = _free_ports(2)
    code = code.replace("tcp://127.0.0.1:5557", f"tcp://127.0.0.1:{live}").replace(
        "tcp://127.0.0.1:5558", f"tcp://127.0.0.1:{replay}"
    )
    ns: dict = {}
    exec(compile(code, "README.md (Using the library)", "exec"), ns)  # noqa: S102 - the README's own code
    pub = ns["pub"]
    assert pub.stats()["batches_published"] >= 1 and pub.stats()["events_published"] >= 1
    ctx = zmq.Context.instance()
    for port in (live, replay):  # closed: both ports can be bound again at once
        sock = ctx.socket(zmq.PUB)
        try:
            sock.bind(f"tcp://127.0.0.1:{port}")
        finally:
            sock.close(0)
