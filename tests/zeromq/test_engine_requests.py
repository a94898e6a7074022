"""kvevents.zeromq.engine_requests: one-shot KVE/DESCRIBE and KVE/SNAPSHOT against a real publisher."""

from __future__ import annotations

import socket

import pytest

from kvevents.events import decode_batch
from kvevents.testing.zeromq import EPH, chain_events
from kvevents.zeromq.engine_requests import EngineRequestError, describe, snapshot
from kvevents.zeromq.publisher import Publisher


def test_describe_and_snapshot_of_a_publisher(pub):
    d = describe(pub.replay_endpoint)
    assert d["epoch"] == pub.epoch and d["newest_seq"] is None
    payloads, covered = snapshot(pub.replay_endpoint)
    assert covered is None and len(payloads) == 1  # nothing published yet: S is "none", the batch clears
    for evs in chain_events(1, 5):
        last = pub.publish(evs)
    payloads, covered = snapshot(pub.replay_endpoint)
    assert covered == last and len(payloads) == 1 and len(decode_batch(payloads[0]).events) == 2  # clear + chain


def test_no_answer_is_a_clear_error():
    with socket.socket() as s:  # bound, never listening: nothing answers there
        s.bind(("127.0.0.1", 0))
        ep = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(EngineRequestError, match="no KVE/DESCRIBE answer"):
            describe(ep, timeout=0.2)
    p = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0, snapshots=False)
    try:
        with pytest.raises(EngineRequestError, match="no KVE/SNAPSHOT answer"):
            snapshot(p.replay_endpoint, timeout=0.3)  # refused by a publisher without snapshots
    finally:
        p.close()
