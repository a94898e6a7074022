"""What a consumer's sockets see of a misconfigured publisher, named in `Subscriber.status()`
(`problem`): live and replay swapped, a live port given as the replay endpoint, CURVE on one side
only, a wrong server key, a client key off the allow-list (kvevents.zeromq.handshake)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from kvevents.testing.zeromq import EPH
from kvevents.zeromq.handshake import LIVE, REPLAY, HandshakeWatch
from kvevents.zeromq.publisher import Publisher, PublisherConfig
from kvevents.zeromq.security import CurveClient, generate_keypair
from kvevents.zeromq.subscriber import Source, Subscriber
from tests.helpers.wait import wait_until


def test_a_connection_dropped_in_its_handshake_is_the_wrong_socket_type() -> None:
    w = HandshakeWatch()
    w.watch("w0", LIVE, "tcp://h:1", curve=False)
    w.watch("w0", REPLAY, "tcp://h:2", curve=False)
    for e in (zmq.EVENT_CONNECTED, zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED):  # a restart: fine
        w.event("w0", LIVE, e)
    assert w.problem("w0") is None
    w.event("w0", REPLAY, zmq.EVENT_CONNECTED)
    w.event("w0", REPLAY, zmq.EVENT_DISCONNECTED)
    assert "tcp://h:2 is not a ROUTER" in str(w.problem("w0"))
    w.event("w0", REPLAY, zmq.EVENT_CONNECTED)
    w.event("w0", REPLAY, zmq.EVENT_HANDSHAKE_SUCCEEDED)  # fixed (a new DEALER, a restarted engine)
    assert w.problem("w0") is None
    w.event("w0", LIVE, zmq.EVENT_CONNECTED)
    w.event("w0", LIVE, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    assert "requires CURVE" in str(w.problem("w0"))


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher(PublisherConfig(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.1))
    yield pub
    pub.close()


def _problem(source: Source, publish: Publisher | None = None, needle: str = "") -> str:
    """Poll a Subscriber of `source` until its status names a problem (one with `needle` in it: a
    vague failure may come before the definite one)."""
    sub = Subscriber([source], request_timeout_s=0.5)
    got: list[str] = []

    def seen() -> bool:
        if publish is not None:
            publish.publish([])
        sub.poll(0.05)
        got[:] = [sub.status()[str(source.name)].problem or ""]
        return bool(got[0]) and needle in got[0]

    try:
        wait_until(f"a problem named for {source}", seen, timeout=10)
    finally:
        sub.stop()
    return got[0]


def test_live_and_replay_swapped(publisher: Publisher) -> None:
    problem = _problem(Source(str(publisher.replay_endpoint), publisher.endpoint, "w0"), needle="is not a PUB socket")
    assert f"{publisher.replay_endpoint} accepts connections but is not a PUB socket" in problem
    assert "live and replay swapped" in problem


def test_a_live_port_given_as_the_replay_endpoint(publisher: Publisher) -> None:
    # a vaguer line (a replay unanswered) may come first; the socket type is named once the handshake fails
    problem = _problem(Source(publisher.endpoint, publisher.endpoint, "w0"), publisher, "is not a ROUTER socket")
    assert f"replay endpoint {publisher.endpoint} is not a ROUTER socket" in problem


def test_a_healthy_source_has_no_problem(publisher: Publisher) -> None:
    sub = Subscriber([Source(publisher.endpoint, publisher.replay_endpoint, "w0")])
    try:
        wait_until("a batch", lambda: (publisher.publish([]), sub.poll(0.05)) and sub.status()["w0"].last_heard)
        assert sub.status()["w0"].problem is None
    finally:
        sub.stop()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("server", "other", "client"):
        out[name], out[f"{name}_secret"] = generate_keypair(tmp_path, name)
    allow = tmp_path / "allow"
    allow.mkdir()
    shutil.copy(out["other"], allow)
    out["allow"] = allow
    return out


def _curve_pub(keys: dict[str, Path], allow: bool = False) -> Publisher:
    return Publisher(
        PublisherConfig(
            endpoint=EPH,
            replay_endpoint=EPH,
            curve_secret_key_file=str(keys["server_secret"]),
            curve_allow_dir=str(keys["allow"]) if allow else None,
        )
    )


def test_curve_mismatches_are_named(keys: dict[str, Path], publisher: Publisher) -> None:
    pub = _curve_pub(keys)
    try:
        wrong = CurveClient.from_files(str(keys["other"]), None)
        needle = "--curve-server-key is not this publisher's public key"
        _problem(Source(pub.endpoint, None, "w", curve=wrong), needle=needle)
        _problem(Source(pub.endpoint, None, "w"), needle=f"{pub.endpoint} requires CURVE")
    finally:
        pub.close()
    plain_client = CurveClient.from_files(str(keys["server"]), None)
    needle = f"{publisher.endpoint} does not use CURVE but this consumer does"
    _problem(Source(publisher.endpoint, None, "w", curve=plain_client), needle=needle)
    guarded = _curve_pub(keys, allow=True)
    try:
        refused = CurveClient.from_files(str(keys["server"]), str(keys["client_secret"]))
        _problem(Source(guarded.endpoint, None, "w", curve=refused), needle="refuses this client's CURVE key")
    finally:
        guarded.close()
