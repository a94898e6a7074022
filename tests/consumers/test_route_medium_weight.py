"""Medium weights: vLLM's and LMCache's host tier "CPU" weighs like CPU_PINNED, DISK / EXTERNAL / FS
like STORAGE, and `kvevents route --medium-weight NAME=W` sets them (a bad value: exit 2, one line)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from kvevents.consumers.indexer import BlockIndex
from kvevents.consumers.router import DEFAULT_MEDIUM_WEIGHTS, PrefixRouter, parse_medium_weights
from kvevents.events import BlockStored, KVEventBatch
from kvevents.hashing import Namespace, event_hashes_int64
from kvevents.zeromq.publisher import Publisher
from tests.helpers.cli import invoke

PAGE = 4
TOKENS = list(range(100, 140))  # 10 pages
KVEVENTS = [sys.executable, "-m", "kvevents"]


def _stored(medium: str) -> BlockStored:
    hs = event_hashes_int64(TOKENS, PAGE, Namespace())
    return BlockStored(hs, None, TOKENS, PAGE, None, medium, None)


def test_host_and_storage_media_of_every_engine_have_their_tier_weight() -> None:
    idx = BlockIndex()
    for medium in ("GPU", "CPU_PINNED", "CPU", "STORAGE", "DISK", "EXTERNAL", "FS", "NVME_SOMETHING"):
        idx.apply(medium.lower(), KVEventBatch(0.0, [_stored(medium)]))
    got = {s.worker: s.score for s in PrefixRouter(idx, PAGE).score(TOKENS)}
    assert got == pytest.approx(
        {
            "gpu": 10.0,
            "cpu_pinned": 8.0,
            "cpu": 8.0,  # vLLM / LMCache host offload: the same tier as SGLang's CPU_PINNED
            "storage": 5.0,
            "disk": 5.0,
            "external": 5.0,
            "fs": 5.0,
            "nvme_something": 5.0,  # unlisted: default_weight
        }
    )


def test_parse_medium_weights_overrides_the_defaults_and_refuses_bad_specs() -> None:
    w = parse_medium_weights(["CPU=0.3", "FS=0", "CPU=0.4", " NEW = 2 "])
    assert w == {**DEFAULT_MEDIUM_WEIGHTS, "CPU": 0.4, "FS": 0.0, "NEW": 2.0}
    assert parse_medium_weights([]) == DEFAULT_MEDIUM_WEIGHTS and parse_medium_weights([]) is not DEFAULT_MEDIUM_WEIGHTS
    for bad in ("CPU", "=1", "CPU=", "CPU=abc", "CPU=-0.5", "CPU=nan", "CPU=inf"):
        with pytest.raises(ValueError, match="--medium-weight"):
            parse_medium_weights([bad])


@pytest.mark.parametrize("spec", ["CPU", "CPU=-1", "CPU=fast", "=0.5", "CPU=nan"])
def test_route_refuses_a_bad_medium_weight_in_one_line(spec: str) -> None:
    proc = invoke(
        "route", "--publisher", "w=tcp://127.0.0.1:5999", "--medium-weight", spec, "--http", "127.0.0.1:0", timeout=30
    )  # in process: refused before anything starts (the watchdog stops a route that serves)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "--medium-weight" in proc.stderr and "Traceback" not in proc.stderr


def _get(port: int, method: str, path: str, body: dict | None = None) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request(
            method, path, body=None if body is None else json.dumps(body), headers={"Content-Type": "application/json"}
        )
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


@pytest.mark.subprocess
def test_route_scores_with_the_weights_given() -> None:
    pub = Publisher(
        endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", bind=True, heartbeat_interval_s=0.1
    )
    other = list(range(500, 504))  # seq 0, before route joins: it comes by replay
    pub.publish([BlockStored(event_hashes_int64(other, PAGE, Namespace()), None, other, PAGE, None, "GPU", None)])
    proc = subprocess.Popen(
        [
            *KVEVENTS,
            "route",
            "--publisher",
            f"w0={pub.endpoint},{pub.replay_endpoint}",
            "--http",
            "127.0.0.1:0",
            "--page-size",
            str(PAGE),
            "--medium-weight",
            "CPU=0.25",
            "--medium-weight",
            "GPU=2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        found = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stderr.readline())
        assert found
        port = int(found.group(1))
        pub.publish([_stored("CPU")])
        deadline = time.monotonic() + 20
        score = None
        while time.monotonic() < deadline and score != pytest.approx(2.5):
            time.sleep(0.1)
            try:
                workers = _get(port, "POST", "/score", {"tokens": TOKENS})["workers"]
            except OSError:
                continue
            score = workers[0]["score"] if workers else None
        assert score == pytest.approx(2.5)  # 10 pages on CPU at 0.25
        (w,) = _get(port, "GET", "/workers")["workers"]
        assert w["replay_framing"] == "4-frame" and w["blocks"] == 11  # seq 0 was repaired by replay
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        pub.close(timeout=0.2)
    assert proc.returncode == 0
