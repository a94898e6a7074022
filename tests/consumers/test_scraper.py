"""The router's load scraper (issue 26 parts 1 and 4): a load-honest simulated worker's /metrics,
in vLLM's names, read over real HTTP into /score's answer; timeouts, bounded bodies, failures that
leave the last load to turn stale. Real sockets on 127.0.0.1, port 0."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvevents.consumers.scraper import MetricsScraper, fetch_text, parse_metrics_urls
from kvevents.consumers.service.core import RouterService, RoutingOptions
from kvevents.sim.http import CompletionsServer, serve_and_publish
from kvevents.sim.timing import LoadHonestEngine, SimTiming
from kvevents.sim.worker import SimWorker
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source
from tests.helpers.push_feed import PAGE, Clock, by_name, score, service

VLLM_PAGE = (Path(__file__).parent / "data" / "vllm-0.33.0-metrics.txt").read_text()


class _Pages:
    """An HTTP server answering GET with whatever `reply` holds: (status, body)."""

    def __init__(self) -> None:
        self.reply: tuple[int, bytes] = (200, VLLM_PAGE.encode())
        pages = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                status, body = pages.reply
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        # poll 0.02 s: shutdown() waits out one poll (0.5 s by default)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(2)


@pytest.fixture
def pages() -> Iterator[_Pages]:
    p = _Pages()
    yield p
    p.close()


def _wait(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _complete(url: str, tokens: list[int], max_tokens: int) -> dict:
    import http.client

    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": tokens, "max_tokens": max_tokens}))
    out = json.loads(conn.getresponse().read())
    conn.close()
    return out


def test_a_load_honest_simulated_worker_is_scraped_into_the_answer():
    """Three requests on a worker running one at a time: its vLLM-named /metrics says 1 running and
    2 waiting, and /score shows that load (decode blocks = its KV use x pool, queue = 2)."""
    gate = threading.Event()
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, bind=True, heartbeat_interval_s=0.1)
    sim = SimWorker("w0", page_size=16, capacity_pages=64)
    engine = LoadHonestEngine(
        SimTiming(1e-6, 1e-3, max_running=1), page_size=16, capacity_pages=64, sleep=lambda s: gate.wait(10)
    )
    web = CompletionsServer(
        "127.0.0.1:0", lambda r: serve_and_publish(sim, pub, r), engine=engine, metrics_names="vllm"
    )
    routing = RoutingOptions(metrics_urls={"w0": f"{web.url}/metrics"}, scrape_interval_s=60)
    svc = RouterService([Source(pub.endpoint, pub.replay_endpoint, "w0")], page_size=16, routing=routing, seed=0)
    threads = [threading.Thread(target=_complete, args=(web.url, list(range(32)), 16), daemon=True) for _ in range(3)]
    try:
        svc.start()
        for t in threads:
            t.start()
        _wait(lambda: engine.waiting == 2 and engine.running == 1, "one running, two queued")
        _wait(lambda: svc.applied_seq("w0") is not None, "the first request's events")
        assert svc.scraper.scrape_once() == {"w0": None}
        w = by_name(score(svc, list(range(32)), route=False))["w0"]
        # 32 prompt + 16 decoded tokens = 3 pages of a 64-page pool: usage 3/64, decode 3 blocks
        assert (w["load_source"], w["queue"], w["active_decode_blocks"], w["load_stale"]) == ("metrics", 2, 3.0, False)
        assert w["matched_pages"] == 2
        gate.set()
        for t in threads:
            t.join(10)
        assert engine.served == 3 and engine.running == 0
        assert svc.scraper.scrape_once() == {"w0": None}
        w = by_name(score(svc, list(range(32)), route=False))["w0"]
        assert (w["queue"], w["active_decode_blocks"], w["active_prefill_blocks"]) == (0, 0.0, 0.0)
        metrics = svc.metrics.render().decode()
        assert 'kvevents_router_load_scrapes_total{outcome="ok",source="w0"}' in metrics
    finally:
        gate.set()
        svc.stop()
        web.close()
        pub.close(0.2)


def test_a_failed_scrape_keeps_the_last_load_which_turns_stale(pages):
    clock = Clock(10.0)
    svc, feed = service(["w"], RoutingOptions(load_stale_after_s=5.0), clock)
    feed.store("w", list(range(2 * PAGE)))
    svc.process()
    scraper = MetricsScraper({"w": pages.url}, svc.loads, PAGE, timeout_s=2.0)
    assert scraper.scrape_once() == {"w": None}
    w = by_name(score(svc, list(range(2 * PAGE)), route=False))["w"]
    assert (w["queue"], w["active_decode_blocks"], w["load_stale"]) == (2, 0.25 * 2048 * 16 / PAGE, False)
    pages.reply = (500, b"oops")
    clock.now += 6.0
    assert scraper.scrape_once() == {"w": "HTTP 500"}
    w = by_name(score(svc, list(range(2 * PAGE)), route=False))["w"]
    assert w["load_stale"] is True and w["queue"] == 2
    pages.reply = (200, b"# nothing of an engine here\nup 1\n")
    assert scraper.scrape_once()["w"] == "no vLLM or SGLang load metrics on the page"
    assert scraper.counters() == {"w": (1, 2)}


def test_a_body_over_the_bound_is_refused(pages):
    pages.reply = (200, b"x" * 5000)
    with pytest.raises(ValueError, match="exceeds 4096"):
        fetch_text(pages.url, 2.0, max_body_bytes=4096)


def test_an_engine_that_never_answers_times_out():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)  # accepts (the kernel does) and never says a word
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/metrics"
        t0 = time.monotonic()
        with pytest.raises(OSError):
            fetch_text(url, 0.3)
        assert time.monotonic() - t0 < 2.0
    finally:
        srv.close()


@pytest.mark.parametrize("spec", ["w0", "=http://h/m", "w0=ftp://h/m", "w0=http:///m", "w0=http://h/m,w0=http://h/n"])
def test_metrics_urls_are_checked(spec):
    with pytest.raises(ValueError):
        parse_metrics_urls(spec.split(","))
    assert parse_metrics_urls(["a=http://127.0.0.1:8000/metrics"]) == {"a": "http://127.0.0.1:8000/metrics"}
