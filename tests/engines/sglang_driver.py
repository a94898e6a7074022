"""SGLang 0.5.20's own code against kvevents, in one process inside the SGLang venv.

Run by tests/engines/test_sglang_real.py as `python sglang_driver.py TMPDIR`; prints one
KVEVENTS-REPORT line (harness.Report). Real: RadixCache + PagedTokenToKVPoolAllocator +
MHATokenToKVPool on CPU, SGLang's ZmqEventPublisher (PUB + replay ROUTER), its msgspec decoder,
its plug-in loading and SchedulerKvEventsPublisher (sglang_plugin_checks.py). Stand-in:
standins.TORCHVISION (sglang_engine.STANDINS).
"""

from __future__ import annotations

import standins

STANDINS = [standins.stub_torchvision()]  # before any SGLang import

import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import msgspec  # noqa: E402
import zmq  # noqa: E402
from harness import Consumer, LossyLink, Recording, Report, diff_counts, once_in_order  # noqa: E402
from sglang.srt.disaggregation.kv_events import KVEventBatch, ZmqEventPublisher  # noqa: E402
from sglang_engine import SGLangEngine, tree_truth, workload  # noqa: E402

from kvevents.plugins.sglang import convert_events  # noqa: E402
from kvevents.publisher import Publisher  # noqa: E402

SOURCE = "sglang"
PER_STEP = 3  # requests per scheduler step
STEPS = 100  # 300 requests
LATE_AT, FLUSH_AT, RESTART_AT = 40, 60, 80
DROP = set(range(12, 17))  # seqs the lossy link drops (in both publisher lifetimes)


class Run:
    """One engine lifetime after another, publishing through SGLang's own ZmqEventPublisher."""

    def __init__(self, report: Report, tmp: str) -> None:
        self.report = report
        self.ep, self.rp = f"ipc://{tmp}/sg-pub", f"ipc://{tmp}/sg-replay"
        self.engine = SGLangEngine()
        self.pub = ZmqEventPublisher(attn_dp_rank=0, endpoint=self.ep, replay_endpoint=self.rp, buffer_steps=5000)
        self.link = LossyLink(self.ep, f"ipc://{tmp}/sg-link", DROP)
        self.gap = Consumer(SOURCE, self.link.endpoint, self.rp)  # loses DROP live, repairs by replay
        self.late: Consumer | None = None
        self.rec = Recording(SOURCE, self.ep, self.rp, f"{tmp}/sglang.kvlog", count=10**6)
        self.published = [0]  # batches per publisher lifetime
        self.sent: list[list] = []  # every batch's SGLang events, for the decoder check
        self.kv_pub = Publisher(endpoint=f"ipc://{tmp}/kv-pub", heartbeat_interval_s=0)
        self.kv_sub = zmq.Context.instance().socket(zmq.SUB)
        self.kv_sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.kv_sub.connect(self.kv_pub.endpoint)
        self.gap.settle(0.3)

    def consumers(self) -> list[tuple[str, Consumer]]:
        return [("gap", self.gap)] + ([("late", self.late)] if self.late is not None else [])

    def step(self, n: int, reqs: list) -> None:
        for r in reqs:
            self.engine.serve(r)
        if n == FLUSH_AT:
            self.engine.flush()
        events = self.engine.take_events()
        if not events:
            return
        seq = self.published[-1]
        self.published[-1] += 1
        self.sent.append(events)
        self.kv_pub.publish(convert_events(events)[0])
        self.pub.publish(KVEventBatch(ts=time.time(), events=events))
        truth = tree_truth(self.engine.cache)
        gen = len(self.published) - 1
        for name, c in self.consumers():
            if c.wait_seq(seq, generation=None if gen == 0 else 1):
                d = diff_counts(truth, c.index.copies(SOURCE))
                self.report.check(f"{name}_index_equals_radix_tree_every_step", not d, f"step {n} seq {seq}: {d}")
            else:
                self.report.check(f"{name}_index_equals_radix_tree_every_step", False, f"step {n}: {c.broken}")

    def restart(self) -> None:
        """A new engine process: a fresh cache and a new ZmqEventPublisher on the same endpoints (seq 0)."""
        self.pub.shutdown()
        self.engine = SGLangEngine()
        self.pub = ZmqEventPublisher(attn_dp_rank=0, endpoint=self.ep, replay_endpoint=self.rp, buffer_steps=5000)
        self.published.append(0)
        for _, c in self.consumers():
            c.settle(0.3)

    def run(self) -> None:
        reqs = workload(STEPS * PER_STEP)
        for n in range(STEPS):
            if n == LATE_AT:
                self.late = Consumer(SOURCE, self.ep, self.rp)
            if n == RESTART_AT:
                self.restart()
            self.step(n, reqs[n * PER_STEP : (n + 1) * PER_STEP])
        for _, c in self.consumers():
            c.settle(0.2)

    def finish(self) -> None:
        r = self.report
        want = [s for n in self.published for s in range(n)]
        for name, c in self.consumers():
            why = c.lifetimes([n - 1 for n in self.published])
            r.check(f"{name}_every_batch_once_in_order", not why, why or f"lifetimes of {self.published} batches")
            restarts = [x.reason for x in c.resets]
            r.check(f"{name}_restart_detected", restarts.count("restart") == 1, f"resets {restarts}")
        replayed = {s for g, s, k in self.gap.deliveries if k == "replay"}
        r.check(
            "gap_repaired_by_replay",
            self.link.dropped == 2 * len(DROP) and DROP <= replayed,
            f"link dropped {self.link.dropped}; replayed {sorted(replayed)[:20]}",
        )
        r.figures.update(
            batches=float(sum(self.published)),
            evicted_tokens=float(self.engine.evicted_tokens),
        )
        self.check_record(want)
        self.check_decoder()

    def check_record(self, want: list[int]) -> None:
        self.rec.proc.send_signal(signal.SIGINT)
        rc, err = self.rec.finish()
        got = self.rec.batch_seqs()
        seqs = [s for k, s in got if k != "reset"]
        resets = [k for k, _ in got if k == "reset"]
        self.report.check(
            "record_every_batch_once_in_order",
            rc == 0 and seqs == want and len(resets) >= 1,
            f"rc {rc} resets {len(resets)} {once_in_order(seqs, len(want))} {err.strip()[-300:]}",
        )

    def check_decoder(self) -> None:
        """SGLang's own decoder (its msgspec KVEventBatch) reads every batch kvevents' Publisher sent."""
        dec = msgspec.msgpack.Decoder(KVEventBatch)
        got = []
        while self.kv_sub.poll(200):
            got.append(dec.decode(self.kv_sub.recv_multipart()[2]))
        same = len(got) == len(self.sent) and all(
            [msgspec.structs.asdict(e) for e in b.events] == [msgspec.structs.asdict(e) for e in sent]
            for b, sent in zip(got, self.sent)
        )
        self.report.check("sglang_decoder_reads_kvevents_publisher", same, f"{len(got)} of {len(self.sent)} batches")

    def close(self) -> None:
        for _, c in self.consumers():
            c.close()
        if self.rec.proc.poll() is None:
            self.rec.proc.kill()
            self.rec.finish()
        self.link.close()
        self.pub.shutdown()
        self.kv_sub.close(0)
        self.kv_pub.close()


def main(tmp: str) -> None:
    report = Report("sglang")
    report.standins = list(STANDINS)
    t = time.monotonic()
    with report.guard("engine_publisher_run"):
        run = Run(report, tmp)
        try:
            run.run()
            run.finish()
        finally:
            run.close()
    report.figures["engine_publisher_s"] = round(time.monotonic() - t, 2)
    import sglang_plugin_checks

    t = time.monotonic()
    with report.guard("plugin_run"):
        sglang_plugin_checks.main(report, tmp)
    report.figures["plugin_s"] = round(time.monotonic() - t, 2)
    report.emit()


if __name__ == "__main__":
    main(sys.argv[1])
