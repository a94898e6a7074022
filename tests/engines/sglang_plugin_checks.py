"""Issue 25 part 3 inside the SGLang venv: kvevents' Publisher as SGLang's publisher "kvevents".

Loaded through SGLang's own plug-in loading (entry-point group sglang.srt.plugins, SGLANG_PLUGINS)
and built by SGLang's own SchedulerKvEventsPublisher from a --kv-events-config string; SGLang's
RadixCache emits the events (sglang_engine.SGLangEngine). Stand-in: standins.TORCHVISION.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections import Counter
from importlib.metadata import entry_points
from typing import Any

import msgspec
import zmq
from harness import Consumer, Report, Route, diff_counts, wait_for
from sglang.srt.disaggregation.kv_events import EventPublisherFactory, KVEventBatch
from sglang.srt.distributed.parallel_state_wrapper import ParallelState
from sglang.srt.managers.scheduler_components.kv_events_publisher import SchedulerKvEventsPublisher
from sglang_engine import PAGE, SGLangEngine, tree_truth, workload

from kvevents.plugins.sglang import ENV_CURVE_ALLOW, ENV_CURVE_SECRET, SGLangPublisher, publisher_config
from kvevents.zeromq.security import CurveClient
from kvevents.zeromq.wire import DESCRIBE_REQUEST, END_SEQ, offset_endpoint

SOURCE = "plug"
STEPS, PER_STEP = 100, 3
GAP_AT, LATE_AT, RESTART_AT = 20, 40, 80


def scheduler_publisher(config: dict[str, Any], engine: SGLangEngine, **ranks: int) -> SchedulerKvEventsPublisher:
    """SGLang's scheduler component, as Scheduler.init_kv_events_publisher builds it."""
    ps = ParallelState.trivial(**ranks)
    return SchedulerKvEventsPublisher(
        kv_events_config=json.dumps(config),
        ps=ps,
        attn_tp_rank=ps.attn_tp_rank,
        attn_cp_rank=ps.attn_cp_rank,
        attn_dp_rank=ps.attn_dp_rank,
        dp_rank=ps.dp_rank,
        tree_cache=engine.cache,
        send_metrics_from_scheduler=None,
        max_running_requests=8,
        max_total_num_tokens=engine.alloc.size,
        get_stats=lambda: None,
    )


def load(report: Report) -> None:
    os.environ["SGLANG_PLUGINS"] = "kvevents"
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    report.check("entry_point_declared", eps.get("kvevents") == "kvevents.plugins.sglang:register", str(eps))
    from sglang.srt.plugins import load_plugins

    load_plugins()
    pub = EventPublisherFactory.create(json.dumps({"publisher": "kvevents", "endpoint": "inproc://kv-probe"}), 0)
    report.check("sglang_factory_builds_kvevents", isinstance(pub, SGLangPublisher), type(pub).__name__)
    pub.shutdown()


def dealer_exchange(endpoint: str, body: bytes, timeout_s: float = 3.0) -> list[list[bytes]]:
    """One request on a DEALER; the replies until an end marker (replay) or the first (describe)."""
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    out: list[list[bytes]] = []
    try:
        d.send_multipart([b"", body])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and d.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
            frames = d.recv_multipart()
            out.append(frames)
            if body == DESCRIBE_REQUEST or (len(frames) == 4 and frames[2] == END_SEQ):
                break
    finally:
        d.close(0)
    return out


def apply_model(model: Counter[int], batch: Any) -> None:
    """What an SGLang-decoded batch does to a plain copy count."""
    for ev in batch.events:
        kind = type(ev).__name__
        if kind == "BlockStored":
            model.update(ev.block_hashes)
        elif kind == "BlockRemoved":
            model.subtract(ev.block_hashes)
        else:
            model.clear()


class PluginRun:
    """300 requests through RadixCache, published by SchedulerKvEventsPublisher -> our publisher."""

    def __init__(self, report: Report, tmp: str) -> None:
        self.report = report
        os.environ.update(KVEVENTS_HEARTBEAT_S="0.2", KVEVENTS_METRICS_PORT="0")
        self.config = {
            "publisher": "kvevents",
            "endpoint": f"ipc://{tmp}/plug-pub",
            "replay_endpoint": "tcp://127.0.0.1:0",
            "buffer_steps": 5000,
            "hwm": 50000,
            "max_queue_size": 1000,
            "topic": "kv",
        }
        self.engine = SGLangEngine()
        self.skp = scheduler_publisher(self.config, self.engine)
        self.pub: SGLangPublisher = self.skp.kv_event_publisher
        self.live = Consumer(SOURCE, self.pub.endpoint, self.pub.replay_endpoint)
        self.late: Consumer | None = None
        self.route = Route(SOURCE, self.pub.endpoint, self.pub.replay_endpoint, PAGE)
        self.newest = [-1]  # per publisher lifetime
        self.live.settle(0.3)

    def consumers(self) -> list[tuple[str, Consumer]]:
        return [("plugin_live", self.live)] + ([("plugin_late", self.late)] if self.late is not None else [])

    def step(self, n: int, reqs: list) -> None:
        for r in reqs:
            self.engine.serve(r)
        if n == GAP_AT:
            self.pub.publisher.drop_live(3)  # kvevents' own hook: these 3 batches only reach the replay ring
        t = time.perf_counter()
        self.skp.publish_kv_events()  # the scheduler's call, once per step
        self.report.figures["plugin_publish_max_ms"] = max(
            self.report.figures.get("plugin_publish_max_ms", 0.0), round((time.perf_counter() - t) * 1000, 3)
        )
        newest = self.pub.publisher.seq_range()[0]
        if newest is None or newest == self.newest[-1]:
            return
        self.newest[-1] = newest
        truth = tree_truth(self.engine.cache)
        for name, c in self.consumers():
            ok = c.wait_seq(newest, generation=None if len(self.newest) == 1 else 1)
            d = diff_counts(truth, c.index.copies(SOURCE)) if ok else c.broken
            self.report.check(f"{name}_index_equals_radix_tree_every_step", not d, f"step {n}: {d}")

    def run(self) -> None:
        reqs = workload(STEPS * PER_STEP, seed=11)
        for n in range(STEPS):
            if n == LATE_AT:
                self.late = Consumer(SOURCE, self.pub.endpoint, self.pub.replay_endpoint, start="snapshot")
            if n == RESTART_AT:
                self.check_wire()
                self.restart()
            self.step(n, reqs[n * PER_STEP : (n + 1) * PER_STEP])

    def restart(self) -> None:
        """A new scheduler process: fresh cache, a new publisher (new epoch, seq from 0), same endpoints."""
        replay = self.pub.replay_endpoint
        self.newest[-1] = self.pub.publisher.seq_range()[0] or 0
        for _, c in self.consumers():  # heartbeats included: every batch of this lifetime is in
            c.wait_seq(self.newest[-1])
        self.pub.shutdown()
        self.engine = SGLangEngine()
        self.skp = scheduler_publisher({**self.config, "replay_endpoint": replay}, self.engine)
        self.pub = self.skp.kv_event_publisher
        self.newest.append(-1)
        for _, c in self.consumers():
            c.settle(0.3)

    def check_wire(self) -> None:
        """SGLang's decoder reads the whole replayed history; DESCRIBE, heartbeats, metrics, fields."""
        r, pub = self.report, self.pub
        dec = msgspec.msgpack.Decoder(KVEventBatch)
        replies = dealer_exchange(pub.replay_endpoint, (0).to_bytes(8, "big"))
        model: Counter[int] = Counter()
        ranks = set()
        for frames in replies[:-1]:
            batch = dec.decode(frames[3])
            ranks.add(batch.attn_dp_rank)
            apply_model(model, batch)
        d = diff_counts(tree_truth(self.engine.cache), +model)
        r.check("sglang_decoder_reads_plugin_replay", not d and ranks == {0} and replies[0][1] == b"kv", d or ranks)
        desc = msgspec.msgpack.decode(dealer_exchange(pub.replay_endpoint, DESCRIBE_REQUEST)[0][1])
        r.check(
            "plugin_describe_epoch", desc.get("epoch") == pub.publisher.epoch and desc.get("page_size") == PAGE, desc
        )
        wait_for(
            lambda: pub.stats()["heartbeats"] >= 1, 5.0
        )  # idle: heartbeats are due every 0.2 s (KVEVENTS_HEARTBEAT_S)
        stats = pub.stats()
        r.check("plugin_heartbeats", stats["heartbeats"] >= 1, stats)
        port = pub.publisher.metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        r.check("plugin_metrics", "kvevents_publisher_batches_total" in body, body[:300])
        cfg = pub.config
        fields = {k: getattr(cfg, k) for k in ("buffer_steps", "hwm", "max_queue_size", "topic")}
        want = {k: self.config[k] for k in fields}
        r.check("plugin_honours_config_fields", fields == want, f"{fields} != {want}")

    def finish(self) -> None:
        r = self.report
        self.newest[-1] = self.pub.publisher.seq_range()[0] or 0
        for _, c in self.consumers():
            c.wait_seq(self.newest[-1])
        for name, c in self.consumers():
            why = c.lifetimes(self.newest if c is self.live else self.newest[-2:])
            r.check(f"{name}_every_batch_once_in_order", not why, why or f"lifetimes ending at {self.newest}")
        replayed = [s for _, s, k in self.live.deliveries if k == "replay"]
        r.check("plugin_gap_repaired_by_replay", len(replayed) >= 3, f"replayed {replayed[:10]}")
        for name, c in self.consumers():
            reasons = [x.reason for x in c.resets]
            r.check(f"{name}_restart_detected", "restart" in reasons, reasons)
        assert self.late is not None
        snaps = [k for g, _, k in self.late.deliveries if k == "snapshot"]
        r.check("plugin_late_joiner_by_snapshot", bool(snaps), f"{len(snaps)} snapshot batches")
        self.check_route()

    def check_route(self) -> None:
        truth = tree_truth(self.engine.cache)
        newest = self.newest[-1]

        def caught_up() -> bool:
            ws = self.route.request("GET", "/workers")["workers"]
            return any(w["last_seq"] is not None and w["last_seq"] >= newest for w in ws)

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not caught_up():
            time.sleep(0.1)
        ws = self.route.request("GET", "/workers")["workers"]
        blocks = sum(w["blocks"] for w in ws)
        self.report.check("route_blocks_equal_radix_tree", blocks == sum(truth.values()), f"{ws} vs {len(truth)}")
        bad = []
        for req in workload(40, seed=11)[:40]:
            want = self.engine.matched_pages(req.tokens, req.salt)
            res = self.route.request("POST", "/score", {"tokens": req.tokens, "cache_salt": req.salt})
            got = max((w.get("matched_pages", 0) for w in res.get("workers", [])), default=0)
            if got != want:
                bad.append((want, got))
        self.report.check("route_score_equals_engine_match", not bad, f"(engine, route) {bad[:5]}")

    def close(self) -> None:
        for _, c in self.consumers():
            c.close()
        self.route.close()
        self.pub.shutdown()


def check_ranks_and_queue(report: Report, tmp: str) -> None:
    """The dp-rank port offset, the batch rank, and a publish that never waits on a full queue."""
    # ipc endpoints get the rank as a suffix, so the sockets bind with no port to race for; the tcp
    # port offset (port + rank) is checked on the config the plug-in builds, before any bind
    cfg = {"publisher": "kvevents", "endpoint": f"ipc://{tmp}/rank-pub", "replay_endpoint": f"ipc://{tmp}/rank-replay"}
    tcp = publisher_config(1, endpoint="tcp://*:5557", replay_endpoint="tcp://127.0.0.1:6000")
    engine = SGLangEngine(pages=8)
    skp = scheduler_publisher({**cfg, "max_queue_size": 2}, engine, attn_dp_size=2, attn_dp_rank=1, dp_size=2)
    pub: SGLangPublisher = skp.kv_event_publisher
    try:
        ok = pub.endpoint.endswith("rank-pub_dp1") and pub.replay_endpoint.endswith("rank-replay_dp1")
        ok = (
            ok and tcp.dp_rank == 1 and offset_endpoint(str(tcp.replay_endpoint), tcp.dp_rank) == "tcp://127.0.0.1:6001"
        )
        report.check("plugin_dp_rank_port_offset", ok, f"{pub.endpoint} {pub.replay_endpoint} {tcp}")
        for r in workload(4, seed=3):
            engine.serve(r)
        skp.publish_kv_events()
        frames: list[list[bytes]] = []
        deadline = time.monotonic() + 5.0
        while len(frames) < 2 and time.monotonic() < deadline:  # the queue's sender thread sends it
            frames = dealer_exchange(pub.replay_endpoint, (0).to_bytes(8, "big"))
        batch = msgspec.msgpack.Decoder(KVEventBatch).decode(frames[0][3])
        report.check("plugin_batch_carries_attn_dp_rank", batch.attn_dp_rank == 1, batch.attn_dp_rank)
        burst = KVEventBatch(ts=time.time(), events=list(batch.events))
        t = time.perf_counter()
        worst = 0.0
        for _ in range(2000):
            t1 = time.perf_counter()
            pub.publish(burst)
            worst = max(worst, time.perf_counter() - t1)
        total = time.perf_counter() - t
        stats = pub.stats()
        report.figures["burst_publish_worst_ms"] = round(worst * 1000, 3)
        report.check(
            "plugin_publish_never_waits",
            stats["dropped_queue_full"] > 0 and total < 5.0,
            f"2000 publishes in {total:.3f}s, worst {worst * 1000:.2f} ms, dropped {stats['dropped_queue_full']}",
        )
    finally:
        pub.shutdown()


def check_curve(report: Report, tmp: str) -> None:
    """CURVE from KVEVENTS_CURVE_SECRET / KVEVENTS_CURVE_ALLOW: a keyed consumer reads, a plain one does not."""
    import zmq.auth

    keys = os.path.join(tmp, "keys")
    allow = os.path.join(tmp, "allow")
    os.makedirs(allow, exist_ok=True)
    os.makedirs(keys, exist_ok=True)
    server_pub, server_secret = zmq.auth.create_certificates(keys, "server")
    client_pub, client_secret = zmq.auth.create_certificates(keys, "client")
    os.replace(client_pub, os.path.join(allow, "client.key"))
    os.environ.update({ENV_CURVE_SECRET: server_secret, ENV_CURVE_ALLOW: allow})
    try:
        engine = SGLangEngine(pages=16)
        cfg = {
            "publisher": "kvevents",
            "endpoint": f"ipc://{tmp}/curve-pub",
            "replay_endpoint": f"ipc://{tmp}/curve-rp",
        }
        skp = scheduler_publisher(cfg, engine)
    finally:
        for k in (ENV_CURVE_SECRET, ENV_CURVE_ALLOW):
            os.environ.pop(k)
    pub: SGLangPublisher = skp.kv_event_publisher
    keyed = Consumer(
        "curve", pub.endpoint, pub.replay_endpoint, curve=CurveClient.from_files(server_pub, client_secret)
    )
    plain = zmq.Context.instance().socket(zmq.SUB)
    plain.setsockopt(zmq.SUBSCRIBE, b"")
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(pub.endpoint)
    try:
        keyed.settle(0.3)
        for r in workload(10, seed=5):
            engine.serve(r)
            skp.publish_kv_events()
        newest = pub.publisher.seq_range()[0] or 0
        ok = keyed.wait_seq(newest)
        d = diff_counts(tree_truth(engine.cache), keyed.index.copies("curve")) if ok else keyed.broken
        report.check("plugin_curve_keyed_consumer_equals_cache", not d, d)
        report.check("plugin_curve_plain_consumer_reads_nothing", not plain.poll(300), "a plain SUB got a message")
    finally:
        keyed.close()
        plain.close(0)
        pub.shutdown()


def main(report: Report, tmp: str) -> None:
    load(report)
    with report.guard("plugin_scheduler_run"):
        run = PluginRun(report, tmp)
        try:
            run.run()
            run.finish()
        finally:
            run.close()
    with report.guard("plugin_ranks_and_queue"):
        check_ranks_and_queue(report, tmp)
    with report.guard("plugin_curve"):
        check_curve(report, tmp)
