"""What a publisher can cost a subscriber is bounded: no stream per dp rank it invents (past
`max_ranks` they are counted and dropped). A raw PUB socket on 127.0.0.1 plays the publisher."""

from __future__ import annotations

import time

import msgspec
import zmq

from kvevents.zeromq.subscriber import Source, Subscriber
from kvevents.zeromq.wire import pack_seq


def test_a_publisher_cannot_make_a_stream_per_rank():
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    ep = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    sub = Subscriber([Source(ep, None, "evil")], max_ranks=4)
    try:
        deadline = time.monotonic() + 5
        while not sub.poll(0.02) and time.monotonic() < deadline:  # joined
            pub.send_multipart([b"", pack_seq(0), msgspec.msgpack.encode((0.0, [], 0))])
        for r in range(1, 500):
            pub.send_multipart([b"", pack_seq(0), msgspec.msgpack.encode((0.0, [], r))])
        deadline = time.monotonic() + 5
        while sub.counters()["dropped_ranks"] < 496 and time.monotonic() < deadline:
            sub.poll(0.02)
        assert sub.counters()["dropped_ranks"] == 496
        assert len(sub.status()["evil"].ranks) == 4
    finally:
        sub.stop()
        pub.close(0)
