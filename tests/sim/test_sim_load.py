"""Load-honest simulated workers (issue 26 part 4): a request takes time in proportion to its
uncached prompt and its max_tokens, queues (in arrival order) behind `max_running` others, and the
worker's /metrics reports it in its engine's names; `kvevents serve --http` serves it all."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from kvevents.consumers.engine_load import EngineLoad, read_engine_loads
from kvevents.sim.http import CompletionsServer
from kvevents.sim.timing import LoadHonestEngine, SimTiming


class Gates:
    """A sleep that records what it was asked and holds the caller until the test opens its gate."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.open = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, s: float) -> None:
        with self.lock:
            self.asked.append(s)
        self.open.wait(10)


def _wait(cond, what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_time_is_proportional_to_uncached_prompt_and_decoded_tokens() -> None:
    asked: list[float] = []
    eng = LoadHonestEngine(SimTiming(2e-6, 1e-3, 4), page_size=16, capacity_pages=64, sleep=asked.append)
    assert eng.run(1000, 7, lambda: 200) == 200
    assert asked == pytest.approx([800 * 2e-6, 7 * 1e-3])
    eng.run(1000, 0, lambda: 1000)  # all cached: no prefill, no decode
    assert asked[2:] == [0.0, 0.0]


def test_requests_queue_in_arrival_order_when_the_worker_is_busy() -> None:
    gates = Gates()
    eng = LoadHonestEngine(SimTiming(1e-6, 0.0, max_running=1), page_size=16, capacity_pages=10, sleep=gates)
    done: list[int] = []

    def go(i: int) -> None:
        eng.run(32, 16, lambda: 0)
        done.append(i)

    first = threading.Thread(target=go, args=(0,))
    first.start()
    _wait(lambda: eng.running == 1 and gates.asked, "the first running")
    rest = []
    for i in (1, 2):
        t = threading.Thread(target=go, args=(i,))
        t.start()
        _wait(lambda: eng.waiting == i, f"{i} queued")
        rest.append(t)
    load = eng.load()
    assert (load.running, load.waiting, load.used_pages, load.usage) == (1, 2, 3, 0.3)
    gates.open.set()
    for t in [first, *rest]:
        t.join(10)
    assert done == [0, 1, 2] and (eng.running, eng.waiting, eng.used_pages, eng.served) == (0, 0, 0, 3)


@pytest.mark.parametrize("names, engine", [("vllm", "vllm"), ("sglang", "sglang")])
def test_metrics_over_http_in_the_engines_names(names: str, engine: str) -> None:
    gates = Gates()
    eng = LoadHonestEngine(SimTiming(1e-6, 1e-3, max_running=1), page_size=16, capacity_pages=8, sleep=gates)
    with CompletionsServer("127.0.0.1:0", lambda r: 0, engine=eng, metrics_names=names) as srv:
        body = json.dumps({"prompt": list(range(40)), "max_tokens": 8})
        threads = [threading.Thread(target=_post, args=(srv.port, body)) for _ in range(2)]
        for t in threads:
            t.start()
        _wait(lambda: eng.running == 1 and eng.waiting == 1, "one running, one queued")
        status, text = _get(srv.port, "/metrics")
        gates.open.set()
        for t in threads:
            t.join(10)
    assert status == 200
    assert read_engine_loads(text, 16) == ([EngineLoad(engine, 0, 1.0, 1.0, 3 / 8, 8.0)], 0)


def test_max_tokens_is_checked() -> None:
    eng = LoadHonestEngine(SimTiming(), page_size=16, capacity_pages=8, sleep=lambda s: None)
    with CompletionsServer("127.0.0.1:0", lambda r: 0, engine=eng) as srv:
        status, out = _post(srv.port, json.dumps({"prompt": [1, 2], "max_tokens": -1}))
        assert status == 400 and "max_tokens" in out
        status, out = _post(srv.port, json.dumps({"prompt": [1, 2], "max_tokens": 5}))
        assert status == 200 and json.loads(out)["usage"]["completion_tokens"] == 5


def test_sim_timing_refuses_nonsense() -> None:
    for bad in ({"prefill_s_per_token": -1}, {"decode_s_per_token": 11}, {"max_running": 0}):
        with pytest.raises(ValueError):
            SimTiming(**bad)  # type: ignore[arg-type]


def test_kvevents_serve_http_exports_vllm_metrics() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "kvevents", "serve", "--endpoint", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*cmd, "--engine", "vllm", "--rate", "5", "--capacity-pages", "128", "--duration", "30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        m = re.search(r"http http://127\.0\.0\.1:(\d+)/v1/completions", " ".join(lines))
        assert m, lines
        port = int(m.group(1))
        status, out = _post(port, json.dumps({"prompt": list(range(64)), "max_tokens": 3}))
        assert status == 200 and json.loads(out)["usage"]["completion_tokens"] == 3
        status, text = _get(port, "/metrics")
        assert status == 200 and "# TYPE vllm:num_requests_running gauge" in text
        assert read_engine_loads(text, 16) == ([EngineLoad("vllm", 0, 0.0, 0.0, 0.0, 128.0)], 0)
    finally:
        proc.terminate()
        proc.wait(10)


def _post(port: int, body: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.status, resp.read().decode()
    conn.close()
    return out


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    out = resp.status, resp.read().decode()
    conn.close()
    return out
