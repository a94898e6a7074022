"""The README's "Using the library" snippet runs as pasted (only its two ports swapped for `*`, ports the OS picks)
and publishes what a subscriber receives."""

from __future__ import annotations

import re

import zmq

from tests.helpers.repo import README


def _snippet() -> str:
    section = README.read_text().split("## Using the library", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_library_snippet_runs_as_pasted() -> None:
    code = _snippet()
    assert "prompt_ids =" in code and "pub.close()" in code  # defines its prompt, closes its publisher
    assert "tcp://127.0.0.1:5557" in code and "tcp://127.0.0.1:5558" in code
    code = code.replace("tcp://127.0.0.1:5557", "tcp://127.0.0.1:*").replace(
        "tcp://127.0.0.1:5558", "tcp://127.0.0.1:*"
    )
    ns: dict = {}
    exec(compile(code, "README.md (Using the library)", "exec"), ns)  # noqa: S102 - the README's own code
    pub = ns["pub"]
    assert pub.stats()["batches_published"] >= 1 and pub.stats()["events_published"] >= 1
    ctx = zmq.Context.instance()
    for endpoint in (pub.endpoint, pub.replay_endpoint):  # the ports the OS gave; closed: free again
        sock = ctx.socket(zmq.PUB)
        try:
            sock.bind(endpoint)
        finally:
            sock.close(0)
