"""`kvevents serve` and `kvevents tail` smoke tests in subprocesses (short durations, ephemeral ports)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.helpers.cli import invoke, spawn

pytestmark = pytest.mark.subprocess


def _start_serve(*extra: str) -> tuple[subprocess.Popen, list[str]]:
    proc = spawn("serve", "--endpoint", "tcp://127.0.0.1:*", "--replay-endpoint", "tcp://127.0.0.1:*", *extra)
    lines = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if sum(1 for ln in lines if ln.startswith("kvevents serve: worker")) == int(
            extra[extra.index("--workers") + 1] if "--workers" in extra else 1
        ):
            return proc, lines
    proc.kill()
    raise AssertionError(f"serve did not start: {lines} {proc.stderr.read() if proc.stderr else ''}")


def _endpoints(line: str) -> tuple[str, str]:
    parts = line.split()
    return parts[parts.index("live") + 1], parts[parts.index("replay") + 1]


def test_serve_two_workers_and_tail_text_and_json():
    proc, lines = _start_serve("--workers", "2", "--duration", "3", "--rate", "200", "--heartbeat", "0.2")
    try:
        live, replay = _endpoints(lines[1])
        assert lines[1].startswith("kvevents serve: worker w1 live ")
        default = lines[1].rstrip("\n").replace(live, "tcp://127.0.0.1:5558").replace(replay, "tcp://127.0.0.1:5560")
        assert len(default) <= 80, default  # with the default ports the line fits 80 columns
        text = invoke("tail", live, "--replay", replay, "--count", "5", "--duration", "8")
        assert text.returncode == 0, text.stderr
        batch_lines = [ln for ln in text.stdout.splitlines() if ln.startswith("seq=")]
        assert batch_lines[0].startswith("seq=0 replay rank=1") and len(batch_lines) == 5
        js = invoke("tail", live, "--replay", replay, "--count", "3", "--json", "--duration", "8")
        assert js.returncode == 0, js.stderr
        objs = [json.loads(ln) for ln in js.stdout.splitlines()]
        batches = [o for o in objs if o["type"] in ("batch", "heartbeat")]
        assert [o["seq"] for o in batches] == [0, 1, 2] and batches[0]["dp_rank"] == 1
        assert any(o["type"] == "notice" and o["what"] == "replays_requested" for o in objs)
        assert batches[0]["events"][0] == {"type": "AllBlocksCleared"}
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        status = [ln for ln in out.splitlines() if ln.startswith("t=")]
        assert status and status[-1].endswith(" (stopped)") and "unsent=" not in status[-1] and "requests=" in status[0]
        assert all(len(ln) <= 80 for ln in status), status  # a status line fits 80 columns
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_serve_stops_cleanly_on_ctrl_c():
    proc, _ = _start_serve("--rate", "50")
    try:
        time.sleep(1.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 130, err  # interrupted, as `demo` says it: after the last status line
        assert out.rstrip().splitlines()[-1].endswith(" (stopped)") and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_metrics_port_0_picks_one_free_port_for_every_rank():
    import urllib.request

    proc, lines = _start_serve("--workers", "2", "--duration", "5", "--metrics-port", "0")
    try:
        urls = {ln.split(" metrics ")[1].strip() for ln in lines if ln.startswith("kvevents serve: worker")}
        assert len(urls) == 1  # both ranks on the one server
        url = urls.pop()
        assert not url.endswith(":0/metrics")
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        live = {_endpoints(ln)[0] for ln in lines if ln.startswith("kvevents serve: worker")}
        assert all(f'endpoint="{ep}"' in body for ep in live)
    finally:
        proc.kill()
        proc.wait()


def test_tail_reports_heartbeats_and_bad_endpoint():
    proc, lines = _start_serve("--rate", "0.5", "--duration", "3", "--heartbeat", "0.1")
    try:
        live, replay = _endpoints(lines[0])
        r = invoke("tail", live, "--count", "4", "--duration", "5")
        assert r.returncode == 0 and "heartbeat" in r.stdout
    finally:
        proc.kill()
        proc.wait()
    bad = invoke("tail", "bogus://x", "--count", "1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    bad = invoke("serve", "--endpoint", "tcp://nohost", "--duration", "1")
    assert bad.returncode == 2


def test_replay_cli_publishes_with_the_recorded_epoch(tmp_path):
    """`kvevents replay` sets PublisherConfig.epoch: DESCRIBE reports the log's epoch at once."""
    import msgspec
    import zmq

    from kvevents.events import KVEventBatch, decode_batch, encode_batch
    from kvevents.recordlog import RecordWriter
    from kvevents.testing.zeromq import stored
    from kvevents.zeromq.wire import DESCRIBE_REQUEST

    log = tmp_path / "e.kvlog"
    with RecordWriter(log) as w:
        w.write(encode_batch(KVEventBatch(1.0, [stored(1)], 0, 4242)), source="w", seq=0, epoch=4242, recv_time=1.0)
    proc = spawn(
        "replay",
        str(log),
        "--to",
        "tcp://127.0.0.1:*",
        "--replay-endpoint",
        "tcp://127.0.0.1:*",
        "--delay",
        "1.5",
        "--linger",
        "0",
        "--heartbeat",
        "0.05",
    )
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.SUB)
    d = ctx.socket(zmq.DEALER)
    try:
        first = proc.stdout.readline()  # type: ignore[union-attr]
        assert first.startswith("replaying"), first
        live, rep = first.split("-> ")[1].split()[0], first.split("(replay ")[1].split(")")[0]
        for sock in (s, d):
            sock.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(live)
        d.connect(rep)
        assert s.poll(2500), "no heartbeat during --delay"
        hb = decode_batch(s.recv_multipart()[2])
        assert hb.events == [] and hb.epoch is None  # strict 3-element wire; the epoch is in DESCRIBE
        d.send_multipart([b"", DESCRIBE_REQUEST])
        assert d.poll(2000)
        assert msgspec.msgpack.decode(d.recv_multipart()[1])["epoch"] == 4242
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "Traceback" not in err, err
    finally:
        s.close(0)
        d.close(0)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
