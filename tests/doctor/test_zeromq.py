"""`kvevents doctor`: the right hints for a dead address, a silent publisher and a wrong topic;
a pass against a healthy publisher (real ZeroMQ on 127.0.0.1; the CLI in-process, beside the engine)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Iterator

import pytest
import zmq

pytest.importorskip("kvevents.zeromq.publisher")
from kvevents.doctor.zeromq import run_doctor  # noqa: E402
from kvevents.zeromq.publisher import Publisher  # noqa: E402
from tests.helpers.cli import invoke as kv  # noqa: E402

PAGE = 4


def _dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class _Engine:
    """A publisher fed by the reference cache (or hand-made chains) on a thread until stopped."""

    def __init__(self, topic: str = "", heartbeat: float = 0.2, extra_key_bug: bool = False) -> None:
        self.pub = Publisher(
            endpoint="tcp://127.0.0.1:*",
            replay_endpoint="tcp://127.0.0.1:*",
            topic=topic,
            heartbeat_interval_s=heartbeat,
        )
        self.stop = threading.Event()
        self.extra_key_bug = extra_key_bug
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _batches(self) -> Iterator[list]:
        from kvevents.hashing import Namespace
        from tests.helpers.recordlog import chain_events

        if self.extra_key_bug:
            yield from chain_events(Namespace("lora-a"), published="storage", n_chains=30)
            return
        try:
            from kvevents.cache import RadixCache
            from kvevents.sim.worker import Workload
        except ImportError:  # pragma: no cover
            yield from chain_events(Namespace(), n_chains=30)
            return
        cache = RadixCache(PAGE, capacity_pages=64)
        for req in Workload(seed=2, page_size=PAGE).take(2000):
            cache.insert(req.tokens, req.namespace)
            if cache.num_pages > 48:
                cache.evict(16)
            yield cache.take_events()

    def _run(self) -> None:
        for i, evs in enumerate(self._batches()):
            if self.stop.wait(0.01 if i % 40 < 30 else 0.05):
                return
            self.pub.publish(evs)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.pub.close()


@pytest.fixture()
def engine() -> Iterator[_Engine]:
    e = _Engine()
    yield e
    e.close()


def test_nothing_listening(tmp_path: Path) -> None:
    port = _dead_port()
    r = kv("doctor", f"tcp://127.0.0.1:{port}", "--timeout", "1", "--page-size", "16")
    assert r.returncode == 1
    assert "address answers" in r.stdout and "FAIL" in r.stdout
    assert f"bound to port {port}" in r.stdout and "--kv-events-config" in r.stdout
    assert r.stderr.strip() == "kvevents: check failed: doctor: 1 check(s) failed: address answers"
    assert "parents stored before the window" not in r.stdout and "nothing was received" in r.stdout


@pytest.mark.parametrize("endpoint", ["garbage", "tcp://127.0.0.1", "tcp://127.0.0.1:70000"])
def test_a_malformed_endpoint_is_a_usage_error(endpoint: str) -> None:
    r = kv("doctor", endpoint)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr.startswith("kvevents: error: ENDPOINT:") and "Connection refused" not in r.stderr


def test_silent_publisher() -> None:
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    try:
        rep = run_doctor(f"tcp://127.0.0.1:{port}", timeout=0.7)
    finally:
        pub.close(0)
    st = {c.name: c for c in rep.checks}
    assert st["address answers"].status == "ok"
    assert st["batches arrive and decode"].status == "fail"
    assert "heartbeat_interval_s" in st["batches arrive and decode"].hint
    assert "replay port" in st["batches arrive and decode"].hint
    assert not rep.ok


def test_wrong_topic_and_a_dead_replay_port() -> None:
    e = _Engine(topic="kv@w1")
    try:
        r = kv(
            "doctor",
            e.pub.endpoint,
            "--topic",
            "kv@w2",
            "--replay",
            f"tcp://127.0.0.1:{_dead_port()}",
            "--timeout",
            "0.5",  # the topic never matches and the port never answers: waiting longer shows nothing more
        )
    finally:
        e.close()
    assert r.returncode == 1
    assert "subscribed to 'kv@w2' but the publisher sends 'kv@w1'" in r.stdout
    assert "use topic 'kv@w1' in the consumer" in r.stdout
    assert "replay_endpoint" in r.stdout  # the replay hint
    assert "topic matches" in r.stderr and "replay answers" in r.stderr


def test_healthy_publisher_passes(engine: _Engine) -> None:
    r = kv(
        "doctor",
        engine.pub.endpoint,
        "--replay",
        engine.pub.replay_endpoint,
        "--page-size",
        str(PAGE),
        "--timeout",
        "1.2",
        "--json",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    import json

    rep = json.loads(r.stdout)
    st = {c["name"]: c for c in rep["checks"]}
    assert all(c["status"] in ("ok", "skip") for c in rep["checks"]), rep["checks"]
    for name in (
        "address answers",
        "batches arrive and decode",
        "seqs continuous",
        "heartbeats come",
        "replay answers",
        "describe answers",
        "published hashes recompute",
    ):
        assert st[name]["status"] == "ok", st[name]
    assert rep["seen"]["topics"] == {"": rep["seen"]["messages"]}


def test_hashes_with_extra_key_fail() -> None:
    e = _Engine(extra_key_bug=True, heartbeat=0.2)
    try:
        rep = run_doctor(e.pub.endpoint, replay=e.pub.replay_endpoint, page_size=PAGE, timeout=1.0)
    finally:
        e.close()
    st = {c.name: c for c in rep.checks}
    assert st["published hashes recompute"].status == "fail", st["published hashes recompute"]
    assert "extra_key" in st["published hashes recompute"].hint
