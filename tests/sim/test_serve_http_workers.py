"""`kvevents serve --http` gives every simulated worker its own /v1/completions (worker i on port + i,
or each a free port), and answers `stream: true` as an event stream (issue 26 part 3)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

pytestmark = pytest.mark.subprocess  # kvevents serve and route as a user runs them

from kvevents.sim.http import serve_http, worker_addresses
from kvevents.sim.worker import SimWorker
from kvevents.zeromq.publisher import Publisher
from tests.helpers.cli import invoke


def test_worker_addresses_offset_the_port_or_take_free_ones() -> None:
    assert worker_addresses("127.0.0.1:8000", 3) == ["127.0.0.1:8000", "127.0.0.1:8001", "127.0.0.1:8002"]
    assert worker_addresses("[::1]:0", 2) == ["[::1]:0", "[::1]:0"]
    with pytest.raises(ValueError, match="2 workers need ports 65535..65536"):
        worker_addresses("127.0.0.1:65535", 2)


def test_serve_refuses_ports_past_the_last_in_one_line() -> None:
    proc = invoke(
        "serve", "--endpoint", "tcp://127.0.0.1:*", "--replay-endpoint", "",
        "--workers", "2", "--http", "127.0.0.1:65535", "--duration", "0.1", timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "need ports" in proc.stderr, proc.stderr


def test_a_streamed_completion_is_chunked_events_with_usage_when_asked() -> None:
    pub = Publisher(endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0)
    web = serve_http("127.0.0.1:0", SimWorker("w3", page_size=4, capacity_pages=64), pub, threading.Lock())
    try:
        tokens = list(range(100, 112))
        for usage in (False, True):
            body = {"prompt": tokens, "stream": True, "stream_options": {"include_usage": usage}}
            with httpx.stream("POST", web.url + "/v1/completions", json=body, timeout=10) as r:
                assert r.headers["content-type"] == "text/event-stream"
                assert r.headers["transfer-encoding"] == "chunked"
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert chunks[0]["choices"][0]["finish_reason"] == "length"
            assert all(c["system_fingerprint"] == "kvevents-sim-w3" for c in chunks)
            if usage:
                assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 12  # the second time
            else:
                assert len(chunks) == 1
        plain = httpx.post(web.url + "/v1/completions", json={"prompt": tokens}, timeout=10)
        assert plain.headers["content-type"] == "application/json" and plain.json()["usage"]["prompt_tokens"] == 12
    finally:
        web.close()
        pub.close(0)
