"""One scenario for any engine's own publisher (runs inside the engine's venv).

Two engine lifetimes (the second a restart: a fresh cache and a new publisher object on the same
endpoints, seq from 0) of 100 scheduler steps of 3 requests each, a cache flush at step 60, and
three consumers: `gap` behind a LossyLink that drops live seqs 12..16 of each lifetime, `late`
joining at step 40, and `kvevents record`; and a `kvevents.relay.Relay` beside the engine with a
consumer of its own (`relay`), the relay itself restarted at step 90 (a new epoch downstream). After every step each consumer's BlockIndex must equal
the engine's own cache (read from the engine's structures, never from what was published); at the
end every batch must have arrived once, in order, the restart must be detected, and the engine's
own decoder must read what kvevents' Publisher sent for the same steps.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
from harness import Consumer, LossyLink, Recording, Report, diff_counts, once_in_order

from kvevents.events import Event
from kvevents.relay import Relay
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.publisher_config import PublisherConfig
from kvevents.zeromq.source import Source

PER_STEP, STEPS = 3, 100
LATE_AT, FLUSH_AT, RESTART_AT, RELAY_RESTART_AT = 40, 60, 80, 90
DROP = set(range(12, 17))


@dataclass
class EngineSide:
    """What the scenario needs of one engine: its cache and its own publisher, as callables."""

    source: str
    new_engine: Callable[[], Any]
    new_publisher: Callable[[str, str], Any]  # (endpoint, replay endpoint) -> the engine's publisher
    publish: Callable[[Any, list], None]  # the engine's own publish of one step's events
    shutdown: Callable[[Any], None]
    serve: Callable[[Any, Sequence[Any]], None]  # one scheduler step's requests
    flush: Callable[[Any], None]  # the engine's cache reset (AllBlocksCleared)
    take_events: Callable[[Any], list]
    truth: Callable[[Any], Counter[int]]  # published-hash copies, from the engine's own structures
    to_kvevents: Callable[[list], list[Event]]  # the step's events as kvevents events
    decode_same: Callable[[bytes, list], bool]  # the engine's decoder reads the payload as these events
    requests: list[Any]


class EngineRun:
    def __init__(self, side: EngineSide, report: Report, tmp: str) -> None:
        self.side, self.report = side, report
        name = side.source
        self.ep, self.rp = f"ipc://{tmp}/{name}-pub", f"ipc://{tmp}/{name}-replay"
        self.engine = side.new_engine()
        self.pub = side.new_publisher(self.ep, self.rp)
        self.link = LossyLink(self.ep, f"ipc://{tmp}/{name}-link", DROP)
        self.gap = Consumer(name, self.link.endpoint, self.rp)
        self.late: Consumer | None = None
        self.rec = Recording(name, self.ep, self.rp, f"{tmp}/{name}.kvlog", count=10**6)
        self.published = [0]
        self.sent: list[list] = []
        self.kv_pub = Publisher(endpoint=f"ipc://{tmp}/{name}-kv-pub", heartbeat_interval_s=0)
        self.kv_sub = zmq.Context.instance().socket(zmq.SUB)
        self.kv_sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.kv_sub.setsockopt(zmq.LINGER, 0)
        self.kv_sub.connect(self.kv_pub.endpoint)
        self.relay_eps = (f"ipc://{tmp}/{name}-relay", f"ipc://{tmp}/{name}-relay-replay")
        self.relay = self.new_relay()
        self.relayed = Consumer(name, *self.relay_eps)
        self.relay_resets: dict[str, int] = {}
        self.gap.settle(0.3)

    def new_relay(self) -> Relay:
        """kvevents relay beside the engine: its stream, gap-repaired, republished with snapshots."""
        conf = PublisherConfig(endpoint=self.relay_eps[0], replay_endpoint=self.relay_eps[1], heartbeat_interval_s=0.2)
        src = Source(self.ep, self.rp, self.side.source)
        return Relay(src, conf, subscriber_options={"request_timeout_s": 1.0, "stale_after_s": 30.0}).start()

    def restart_relay(self) -> None:
        for reason, n in self.relay.stats()["resets"].items():
            self.relay_resets[reason] = self.relay_resets.get(reason, 0) + n
        self.relay.stop()
        self.relay = self.new_relay()
        want, warm = self.published[-1], self.relay.stats()["warm_start_batches"]
        self.report.check("relay_warm_start_read_the_engine_ring", warm == want, f"{warm} of {want} batches")
        self.check_resynced(self.side.truth(self.engine))
        # as the consumers get after a restart: a batch the engine sends before the new relay's SUB
        # has joined is lost to it, and (engines send no heartbeats) shows only at the next batch
        time.sleep(0.3)

    def check_resynced(self, truth: Counter[int]) -> None:
        """Before the engine's next batch, the relay's consumer has seen the new relay's epoch and
        holds the engine's cache again (the relay rebuilt it from the engine's ring at start)."""
        deadline = time.monotonic() + 6.0
        restarts = lambda: sum(1 for x in self.relayed.resets if x.reason == "restart")  # noqa: E731
        before = restarts()
        d = "no restart seen"
        while time.monotonic() < deadline:
            self.relayed.pump(0.02)
            if restarts() > before:
                d = diff_counts(truth, self.relayed.index.copies(self.side.source))
                if not d:
                    break
        self.report.check("relay_restart_resynced_while_the_engine_is_idle", not d, f"{d}")

    def check_relayed(self, n: int, truth: Counter[int]) -> None:
        """The relay's consumer equals the engine's cache (its seqs are the relay's, so wait for equality)."""
        deadline = time.monotonic() + 6.0
        d = diff_counts(truth, self.relayed.index.copies(self.side.source))
        while d and time.monotonic() < deadline:
            self.relayed.pump(0.02)
            d = diff_counts(truth, self.relayed.index.copies(self.side.source))
        self.report.check("relay_index_equals_engine_cache_every_step", not d, f"step {n}: {d}")

    def consumers(self) -> list[tuple[str, Consumer]]:
        return [("gap", self.gap)] + ([("late", self.late)] if self.late is not None else [])

    def step(self, n: int, reqs: Sequence[Any]) -> None:
        s = self.side
        s.serve(self.engine, reqs)
        if n == FLUSH_AT:
            s.flush(self.engine)
        events = s.take_events(self.engine)
        if not events:
            return
        seq = self.published[-1]
        self.published[-1] += 1
        self.sent.append(events)
        self.kv_pub.publish(s.to_kvevents(events))
        s.publish(self.pub, events)
        truth = s.truth(self.engine)
        lifetime = len(self.published) - 1
        for name, c in self.consumers():
            if c is self.gap and seq in DROP:
                # a lost batch shows only when a later one arrives (engines send no heartbeats): this
                # step is compared once the next batch has made the consumer repair the gap
                self.report.figures["gap_steps_not_compared"] = self.report.figures.get("gap_steps_not_compared", 0) + 1
                continue
            ok = c.wait_seq(seq, generation=None if lifetime == 0 else 1)
            d = diff_counts(truth, c.index.copies(s.source)) if ok else c.broken
            self.report.check(f"{name}_index_equals_engine_cache_every_step", not d, f"step {n} seq {seq}: {d}")
        self.check_relayed(n, truth)

    def restart(self) -> None:
        self.side.shutdown(self.pub)
        self.engine = self.side.new_engine()
        self.pub = self.side.new_publisher(self.ep, self.rp)
        self.published.append(0)
        for _, c in self.consumers():
            c.settle(0.3)

    def run(self) -> None:
        reqs = self.side.requests
        for n in range(STEPS):
            if n == LATE_AT:  # it learns of the stream from its first live batch, then replays from 0
                self.late = Consumer(self.side.source, self.ep, self.rp)
                self.late.settle(0.3)
            if n == RESTART_AT:
                self.restart()
            if n == RELAY_RESTART_AT:
                self.restart_relay()
            self.step(n, reqs[n * PER_STEP : (n + 1) * PER_STEP])
        for _, c in self.consumers():
            c.settle(0.2)

    def finish(self) -> None:
        r = self.report
        for name, c in self.consumers():
            why = c.lifetimes([n - 1 for n in self.published])
            r.check(f"{name}_every_batch_once_in_order", not why, why or f"lifetimes of {self.published} batches")
            reasons = [x.reason for x in c.resets]
            r.check(f"{name}_restart_detected", reasons.count("restart") == 1, f"resets {reasons}")
        replayed = {s for _, s, k in self.gap.deliveries if k == "replay"}
        r.check(
            "gap_repaired_by_replay",
            self.link.dropped == 2 * len(DROP) and DROP <= replayed,
            f"link dropped {self.link.dropped}; replayed {sorted(replayed)[:20]}",
        )
        for reason, k in self.relay.stats()["resets"].items():
            self.relay_resets[reason] = self.relay_resets.get(reason, 0) + k
        down = [x.reason for x in self.relayed.resets]
        r.check(
            "relay_republished_the_engine_restart",
            self.relay_resets.get("restart") == 1,
            f"relay resets {self.relay_resets} (the engine restarted once)",
        )
        r.check("relay_restart_seen_downstream", down.count("restart") == 1, f"downstream resets {down}")
        r.figures["batches"] = float(sum(self.published))
        self.check_record([s for n in self.published for s in range(n)])
        self.check_decoder()

    def check_record(self, want: list[int]) -> None:
        deadline = time.monotonic() + 15.0  # its repairs may still be running: give it time to catch up
        while time.monotonic() < deadline and sum(1 for k, _ in self.rec.batch_seqs() if k != "reset") < len(want):
            time.sleep(0.1)
        self.rec.proc.send_signal(signal.SIGINT)
        rc, err = self.rec.finish()
        got = self.rec.batch_seqs()
        seqs = [s for k, s in got if k != "reset"]
        resets = sum(1 for k, _ in got if k == "reset")
        self.report.check(
            "record_every_batch_once_in_order",
            rc == 130 and seqs == want and resets >= 1,  # Ctrl-C: the summary, then exit 130
            f"rc {rc} resets {resets} {once_in_order(seqs, len(want))} {err.strip()[-300:]}",
        )

    def check_decoder(self) -> None:
        """The engine's own decoder reads every batch kvevents' Publisher sent for the same steps."""
        got = []
        while self.kv_sub.poll(300):
            got.append(self.kv_sub.recv_multipart()[2])
        same = len(got) == len(self.sent) and all(self.side.decode_same(p, e) for p, e in zip(got, self.sent))
        self.report.check(
            f"{self.side.source}_decoder_reads_kvevents_publisher", same, f"{len(got)} of {len(self.sent)} batches"
        )

    def close(self) -> None:
        for _, c in self.consumers():
            c.close()
        self.relayed.close()
        self.relay.stop()
        if self.rec.proc.poll() is None:
            self.rec.proc.kill()
            self.rec.finish()
        self.link.close()
        self.side.shutdown(self.pub)
        self.kv_sub.close(0)
        self.kv_pub.close()


def run_engine(side: EngineSide, report: Report, tmp: str) -> None:
    t = time.monotonic()
    with report.guard("engine_publisher_run"):
        run = EngineRun(side, report, tmp)
        try:
            run.run()
            run.finish()
        finally:
            run.close()
    report.figures["engine_publisher_s"] = round(time.monotonic() - t, 2)
