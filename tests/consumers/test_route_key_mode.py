"""`kvevents route --key-mode`: a vLLM publisher and a contract publisher routed by one router."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import time

import pytest

from kvevents.hashing import Namespace
from kvevents.sim.vllm import VllmSimWorker
from kvevents.sim.worker import Request, SimWorker
from kvevents.zeromq.publisher import Publisher
from tests.helpers.cli import invoke, one_line_error, spawn


def _score(port: int, tokens: list[int]) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request(
            "POST",
            "/score",
            body=json.dumps({"tokens": tokens, "cache_salt": "t"}),
            headers={"Content-Type": "application/json"},
        )
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


@pytest.mark.subprocess
def test_route_keys_a_vllm_publisher_by_tokens_and_a_contract_one_by_detection():
    vp = Publisher(
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        bind=True,
        heartbeat_interval_s=0.1,
        snapshots=False,
    )
    cp = Publisher(
        endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", bind=True, heartbeat_interval_s=0.1
    )
    proc = spawn(
        "route",
        "--publisher",
        f"vllm-0={vp.endpoint},{vp.replay_endpoint}",
        "--publisher",
        f"sglang-0={cp.endpoint},{cp.replay_endpoint}",
        "--key-mode",
        "vllm-0=tokens",
        "--http",
        "127.0.0.1:0",
        "--page-size",
        "4",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        found = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stderr.readline())
        assert found
        port = int(found.group(1))
        tokens = list(range(40))
        v, c = VllmSimWorker("v", block_size=4, hash_algo="sha256_cbor"), SimWorker("c", page_size=4)
        v.serve(tokens, cache_salt="t")
        vp.publish_payload(v.take_payload(time.time()))
        c.serve(Request(tokens, Namespace(cache_salt="t")))
        cp.publish(c.take_events())
        deadline = time.monotonic() + 20
        pages: dict = {}
        while time.monotonic() < deadline and pages != {"vllm-0": 10, "sglang-0": 10}:
            time.sleep(0.1)
            try:
                pages = {w["worker"]: w["matched_pages"] for w in _score(port, tokens)["workers"]}
            except OSError:
                continue
        assert pages == {"vllm-0": 10, "sglang-0": 10}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/workers")
        modes = {w["worker"]: w["key_mode"] for w in json.loads(conn.getresponse().read())["workers"]}
        conn.close()
        assert modes == {"vllm-0": "tokens", "sglang-0": "contract"}  # forced / detected
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        vp.close(timeout=0.2)
        cp.close(timeout=0.2)
    assert proc.returncode == 0, proc.stderr.read()


def test_route_rejects_a_bad_key_mode():
    for spec, needle in (("w=fast", "key mode"), ("other=tokens", "no publisher")):
        proc = invoke("route", "--publisher", "w=tcp://127.0.0.1:5999", "--key-mode", spec, "--http", "127.0.0.1:0")
        one_line_error(proc, 2, needle)
