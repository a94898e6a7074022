"""kvevents.relay: an engine's stream republished through kvevents publishers, over real sockets.

The engine here is a kvevents Publisher set up as vLLM's (replay ring, no snapshots, no
heartbeats); tests/engines runs the same relay behind vLLM's own publisher.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvevents.events import decode_batch
from kvevents.relay import Relay
from kvevents.testing.zeromq import EPH, apply, chain_events, collect
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.publisher_config import PublisherConfig
from kvevents.zeromq.security import CurveClient, generate_keypair
from kvevents.zeromq.source import Source
from kvevents.zeromq.subscriber import Subscriber
from tests.helpers.cli import invoke

FAST = {"request_timeout_s": 0.5, "stale_after_s": 1.0}


def _engine(endpoint: str = EPH, replay: str = EPH, rank: int = 0) -> Publisher:
    """An engine publisher as vLLM runs one: a replay ring, no snapshots, no heartbeats."""
    return Publisher(endpoint=endpoint, replay_endpoint=replay, snapshots=False, heartbeat_interval_s=0, dp_rank=rank)


def _relay(
    engine: Publisher, endpoint: str = EPH, replay: str = EPH, *, warm_start_s: float = 2.0, **cfg: object
) -> Relay:
    src = Source(engine.endpoint, engine.replay_endpoint, "eng")
    conf = PublisherConfig(endpoint=endpoint, replay_endpoint=replay, heartbeat_interval_s=0.2, **cfg)
    return Relay(src, conf, subscriber_options=FAST, warm_start_s=warm_start_s).start()


def _pump(engine: Publisher, relay: Relay, until: int, timeout: float = 5.0) -> None:
    """The relay hears of a stream only from a live batch (vLLM sends no heartbeats): publish empty
    batches until the relay has republished `until` batches."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(relay.stats()["relayed"].values()) >= until:
            return
        engine.publish([])
        time.sleep(0.02)
    raise AssertionError(f"relay republished {relay.stats()['relayed']}, wanted {until}")


def _downstream(relay: Relay, rank: int = 0, **kw: object) -> Subscriber:
    pub = relay.publishers[rank]
    return Subscriber([Source(pub.endpoint, pub.replay_endpoint, "relay", **kw)], **FAST)  # type: ignore[arg-type]


def _state(items: list) -> dict:
    state: dict = {}
    for it in items:
        if hasattr(it, "batch"):
            apply(state, it.batch)
        else:
            state.clear()  # a Reset drops the source's blocks
    return state


def _engine_state(engine: Publisher) -> dict:
    state: dict = {}
    for _, _, payload in engine.ring_items():
        apply(state, decode_batch(payload))
    return state


def _payloads(items: list) -> list[bytes]:
    return [it.payload for it in items if hasattr(it, "batch") and it.batch.events]


def test_a_late_consumer_gets_every_batch_once_in_order_with_the_engines_bytes() -> None:
    engine = _engine()
    relay = _relay(engine)
    try:
        for events in chain_events(1, 30):
            engine.publish(events)
        _pump(engine, relay, 31)
        sub = _downstream(relay)  # joins after 30 batches: repairs them from the relay's ring
        try:
            items = collect(sub, lambda got: len(_payloads(got)) >= 30)
        finally:
            sub.stop()
        seqs = [it.seq for it in items if hasattr(it, "batch")]
        assert seqs == sorted(set(seqs)), "every batch once, in order"
        engine_bytes = [p for _, _, p in engine.ring_items() if decode_batch(p).events]
        assert _payloads(items)[:30] == engine_bytes[:30]  # the engine's payload bytes, unchanged
        assert _state(items) == _engine_state(engine)
        assert relay.stats()["failed"] == 0
    finally:
        relay.stop()
        engine.close()


def test_a_consumer_that_loses_live_frames_repairs_them_from_the_relay() -> None:
    engine = _engine()
    relay = _relay(engine)
    try:
        _pump(engine, relay, 1)
        sub = _downstream(relay)
        try:
            collect(sub, lambda got: any(hasattr(i, "batch") for i in got))
            relay.publishers[0].drop_live(5)  # the next 5 relayed batches never reach the consumer live
            for events in chain_events(100, 12):
                engine.publish(events)
            items = collect(sub, lambda got: len(_payloads(got)) >= 12)
        finally:
            sub.stop()
        assert sum(1 for i in items if getattr(i, "kind", "") == "replay") >= 5
        assert _state(items) == _engine_state(engine)
    finally:
        relay.stop()
        engine.close()


def test_an_engine_restart_is_republished_as_all_blocks_cleared(tmp_path: Path) -> None:
    live, replay = f"ipc://{tmp_path}/eng", f"ipc://{tmp_path}/eng-replay"
    engine = _engine(live, replay)
    relay = _relay(engine)
    sub = _downstream(relay)
    try:
        for events in chain_events(1, 10):
            engine.publish(events)
        _pump(engine, relay, 11)
        collect(sub, lambda got: len(_payloads(got)) >= 10)
        engine.close()
        engine = _engine(live, replay)  # a new engine process: seq from 0, its old blocks gone
        deadline = time.monotonic() + 5
        while not relay.stats()["resets"] and time.monotonic() < deadline:
            engine.publish([])  # until the relay sees the seq go back
            time.sleep(0.02)
        for events in chain_events(500, 4):
            engine.publish(events)
        deadline = time.monotonic() + 5
        items: list = []
        want = _engine_state(engine)
        while time.monotonic() < deadline:
            items.extend(sub.poll(0.05))
            if {h for _, h in _state_after_reset(items)} == {h for _, h in want}:
                break
        assert _state_after_reset(items) == want, "no block of the dead engine survives downstream"
        assert relay.stats()["resets"].get("restart") == 1
    finally:
        sub.stop()
        relay.stop()
        engine.close()


def _state_after_reset(items: list) -> dict:
    """The downstream state from the last AllBlocksCleared the relay sent on."""
    state: dict = {}
    for it in items:
        if hasattr(it, "batch"):
            apply(state, it.batch)
    return state


def test_a_relay_restart_is_a_new_epoch_and_consumers_resync_by_snapshot(tmp_path: Path) -> None:
    engine = _engine()
    rl, rr = f"ipc://{tmp_path}/relay", f"ipc://{tmp_path}/relay-replay"
    relay = _relay(engine, rl, rr)
    sub = _downstream(relay)
    try:
        for events in chain_events(1, 8):
            engine.publish(events)
        _pump(engine, relay, 9)
        collect(sub, lambda got: len(_payloads(got)) >= 8)
        first_epoch = relay.publishers[0].epoch
        relay.stop()
        for events in chain_events(50, 3):  # published while no relay runs
            engine.publish(events)
        relay = _relay(engine, rl, rr)  # rebuilds its view from the engine's ring (seq 0 on)
        _pump(engine, relay, 8 + 3 + 1)
        assert relay.publishers[0].epoch != first_epoch
        want = _engine_state(engine)
        items = collect(
            sub, lambda got: any(getattr(i, "reason", "") == "restart" for i in got) and _state(got) == want
        )
        assert _state(items) == want
        assert any(getattr(i, "kind", "") == "snapshot" for i in items)
    finally:
        sub.stop()
        relay.stop()
        engine.close()


def _restarted_idle(tmp_path: Path, warm_start_s: float) -> tuple[Publisher, Relay, Subscriber, list]:
    """An engine that published 4 batches, a consumer of the relay holding them, then the relay
    restarted (a new epoch) while the engine stays idle: (engine, new relay, consumer, what it got)."""
    engine = _engine()
    rl, rr = f"ipc://{tmp_path}/relay", f"ipc://{tmp_path}/relay-replay"
    relay = _relay(engine, rl, rr)
    sub = _downstream(relay)
    for events in chain_events(1, 4):
        engine.publish(events)
    _pump(engine, relay, 5)
    got = collect(sub, lambda items: len(_payloads(items)) >= 4)
    relay.stop()
    return engine, _relay(engine, rl, rr, warm_start_s=warm_start_s), sub, got


def _restarted(items: list) -> bool:
    return any(getattr(i, "reason", "") == "restart" for i in items)


def test_a_relay_restarted_while_its_engine_is_idle_rebuilds_from_the_engines_ring(tmp_path: Path) -> None:
    """Engines send no heartbeats: the new relay reads the engine's replay ring at start, so its
    consumers resync to the engine's blocks without waiting for the engine's next batch."""
    engine, relay, sub, got = _restarted_idle(tmp_path, 2.0)
    try:
        want = _engine_state(engine)
        got += collect(sub, lambda items: _restarted(items) and _state(got + items) == want)
        assert _state(got) == want and relay.stats()["warm_start_batches"] == len(engine.ring_items())  # the whole ring
    finally:
        sub.stop()
        relay.stop()
        engine.close()


def test_a_relay_without_its_engines_state_never_empties_its_consumers(tmp_path: Path) -> None:
    """Without the warm start (or an engine that does not answer it) the relay cannot know the
    engine's state until the engine's next batch: it sends nothing (no heartbeat of its new epoch),
    so a consumer keeps the blocks the previous relay gave it instead of resyncing to an empty
    snapshot; the next batch brings the new epoch and the state."""
    engine, relay, sub, got = _restarted_idle(tmp_path, 0.0)
    try:
        deadline = time.monotonic() + 1.0  # five of the new relay's heartbeat intervals
        while time.monotonic() < deadline:
            got += sub.poll(0.05)
        assert relay.publishers[0].stats()["heartbeats"] == 0
        assert not _restarted(got) and _state(got) == _engine_state(engine)
        engine.publish(chain_events(20, 1)[0])
        want = _engine_state(engine)
        got += collect(sub, lambda items: _restarted(items) and _state(got + items) == want)
        assert _state(got) == want
        time.sleep(0.5)  # now it knows the stream: its heartbeats go on
        assert relay.publishers[0].stats()["heartbeats"] > 0
    finally:
        sub.stop()
        relay.stop()
        engine.close()


def test_a_warm_start_cut_short_is_relayed_as_far_as_it_came() -> None:
    """An engine whose replay ROUTER sends two batches of its ring and then nothing: the relay's warm
    start gives up within its time and relays those two (the rest would come as a gap, replayed)."""
    import zmq

    from kvevents.events import BatchEncoder
    from kvevents.zeromq.wire import pack_seq

    ctx = zmq.Context.instance()
    live, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    for sock in (live, router):
        sock.setsockopt(zmq.LINGER, 0)
    live.bind("tcp://127.0.0.1:0")
    router.bind("tcp://127.0.0.1:0")
    ring = [BatchEncoder().encode(1.0, events, 0, None) for events in chain_events(1, 2)]
    answered = threading.Event()

    def engine() -> None:  # answers the first replay request with the ring's first two batches only
        if router.poll(5000):
            who = router.recv_multipart()[0]
            for seq, payload in enumerate(ring):
                router.send_multipart([who, b"", b"", pack_seq(seq), payload])
            answered.set()

    t = threading.Thread(target=engine)
    t.start()
    src = Source(live.getsockopt_string(zmq.LAST_ENDPOINT), router.getsockopt_string(zmq.LAST_ENDPOINT), "eng")
    conf = PublisherConfig(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.2)
    t0 = time.monotonic()
    relay = Relay(src, conf, subscriber_options=FAST, warm_start_s=0.5).start()
    try:
        assert answered.is_set() and time.monotonic() - t0 < 2.0
        assert relay.stats()["warm_start_batches"] == 2
        assert relay.subscriber.status()["eng"].replay_framing == "4-frame"  # learned from the warm start
        deadline = time.monotonic() + 5
        while relay.stats()["relayed"]["live"] < 2:
            assert time.monotonic() < deadline, relay.stats()
            time.sleep(0.02)
        assert [p for _, _, p in relay.publishers[0].ring_items()] == ring  # the engine's bytes
    finally:
        relay.stop()
        t.join(5)
        live.close(0)
        router.close(0)


def test_a_publisher_can_hold_its_heartbeats_until_its_first_batch() -> None:
    pub = Publisher(endpoint=EPH, heartbeat_interval_s=0.05, heartbeat_before_first=False)
    try:
        time.sleep(0.3)
        assert pub.stats()["heartbeats"] == 0
        pub.publish(chain_events(1, 1)[0])
        deadline = time.monotonic() + 5
        while pub.stats()["heartbeats"] == 0:
            assert time.monotonic() < deadline, "no heartbeat after the first batch"
            time.sleep(0.02)
    finally:
        pub.close()


def test_curve_on_the_relays_side_only(tmp_path: Path) -> None:
    server, server_secret = generate_keypair(tmp_path / "server", "server")
    client, client_secret = generate_keypair(tmp_path / "client", "client")
    _, other_secret = generate_keypair(tmp_path / "other", "other")
    allow = tmp_path / "allow"
    allow.mkdir()
    (allow / "client.key").write_bytes(client.read_bytes())
    engine = _engine()  # the engine's loopback stream is plain
    relay = _relay(engine, curve_secret_key_file=str(server_secret), curve_allow_dir=str(allow))
    try:
        for events in chain_events(1, 5):
            engine.publish(events)
        _pump(engine, relay, 6)
        plain = _downstream(relay)  # no keys: no handshake
        stranger = _downstream(relay, curve=CurveClient.from_files(server, other_secret))  # keys not allowed
        allowed = _downstream(relay, curve=CurveClient.from_files(server, client_secret))
        try:
            items = collect(allowed, lambda got: len(_payloads(got)) >= 5)
            assert _state(items) == _engine_state(engine)
            end = time.monotonic() + 1.0
            seen: list = []
            while time.monotonic() < end:
                seen.extend(plain.poll(0.02) + stranger.poll(0.02))
            assert not [i for i in seen if hasattr(i, "batch")], "nothing reaches a client without the keys"
        finally:
            for sub in (plain, stranger, allowed):
                sub.stop()
        assert relay.publishers[0].stats()["curve_denied"] >= 1
    finally:
        relay.stop()
        engine.close()


def test_one_relay_serves_every_dp_rank_on_its_own_ports() -> None:
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    engines = [_engine(f"inproc://eng-{tag}", f"inproc://eng-{tag}-replay", rank=r) for r in range(2)]
    src = Source(f"inproc://eng-{tag}", f"inproc://eng-{tag}-replay", "eng")
    conf = PublisherConfig(endpoint=f"inproc://rel-{tag}", replay_endpoint=f"inproc://rel-{tag}-replay")
    relay = Relay(src, conf, ranks=2, subscriber_options=FAST).start()
    try:
        assert [p.endpoint for p in relay.publishers] == [f"inproc://rel-{tag}", f"inproc://rel-{tag}_dp1"]
        for r, eng in enumerate(engines):
            for events in chain_events(1000 * (r + 1), 3):
                eng.publish(events)
        deadline = time.monotonic() + 5
        while sum(relay.stats()["relayed"].values()) < 8 and time.monotonic() < deadline:
            for eng in engines:
                eng.publish([])
            time.sleep(0.02)
        subs = [_downstream(relay, r) for r in range(2)]
        try:
            for r, sub in enumerate(subs):
                items = collect(sub, lambda got: len(_payloads(got)) >= 3)
                assert {it.dp_rank for it in items if hasattr(it, "batch")} == {r}
                assert _state(items) == _engine_state(engines[r])
        finally:
            for sub in subs:
                sub.stop()
    finally:
        relay.stop()
        for eng in engines:
            eng.close()


def test_relay_refuses_more_ranks_than_it_can_track_and_a_non_zero_base_rank() -> None:
    src = Source("tcp://127.0.0.1:5557", None, "eng")
    with pytest.raises(ValueError, match="ranks must be in 1..64"):
        Relay(src, PublisherConfig(endpoint=EPH), ranks=65)
    with pytest.raises(ValueError, match="rank 0's"):
        Relay(src, PublisherConfig(endpoint=EPH, dp_rank=1))


@pytest.mark.parametrize(
    "args, says",
    [
        (["--from", "no-endpoint", "--endpoint", "tcp://127.0.0.1:0"], "--from 'no-endpoint': expected NAME=ENDPOINT"),
        (["--from", "e=tcp://127.0.0.1:5557", "--endpoint", "tcp://127.0.0.1:99999"], "99999"),
        (
            ["--from", "e=tcp://127.0.0.1:5557", "--endpoint", "tcp://127.0.0.1:0", "--curve-allow", "x"],
            "--curve-allow",
        ),
    ],
)
def test_relay_cli_bad_input_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    proc = invoke("relay", *args, timeout=30)  # in process (the watchdog stops a relay that runs)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr


@pytest.mark.subprocess
def test_relay_cli_runs_beside_an_engine_and_exits_130_on_ctrl_c() -> None:
    engine = _engine()
    for events in chain_events(1, 2):  # before the relay: its warm start reads them from the ring
        engine.publish(events)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvevents", "relay", "--from", f"eng={engine.endpoint},{engine.replay_endpoint}",
         "--endpoint", "tcp://127.0.0.1:0", "--replay-endpoint", "tcp://127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        banner = proc.stdout.readline() if proc.stdout else ""
        assert banner.startswith("kvevents relay: rank 0 from"), banner
        words = banner.split()
        live, rep = words[words.index("live") + 1], words[words.index("replay", words.index("live")) + 1]
        for events in chain_events(10, 4):
            engine.publish(events)
        sub = Subscriber([Source(live, rep, "relay")], **FAST)  # type: ignore[arg-type]
        try:
            deadline = time.monotonic() + 10
            items: list = []
            while len(_payloads(items)) < 6 and time.monotonic() < deadline:
                engine.publish([])
                items.extend(sub.poll(0.05))
            assert _state(items) == _engine_state(engine)
        finally:
            sub.stop()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, err
        assert "kvevents relay: relayed" in out and "Traceback" not in err
        warm = out.split("(live includes ")[1].split()[0] if "(live includes " in out else "0"
        assert int(warm) >= 2 and "read from the engine's ring at start)" in out, out  # more if it started late
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        engine.close()
