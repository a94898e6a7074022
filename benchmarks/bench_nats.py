"""NATS JetStream path against the direct ZeroMQ path, in one run, with a real nats-server (loopback).

    python benchmarks/bench_nats.py            # everything (about a minute)
    python benchmarks/bench_nats.py --quick    # smaller runs
    python benchmarks/bench_nats.py --sign     # bridges sign, routers verify (issue 28)

- throughput: an engine publishes N one-block batches as fast as it can; batches/s is N over the
  time from the first publish to the router's index having applied the last one. Paths:
  `zmq` (Publisher -> Subscriber -> BlockIndex) and `nats` (Publisher -> Bridge -> JetStream (file
  storage) -> JetStreamFeed -> BlockIndex), the bridge and router in this process.
- latency: the same paths at a paced rate; p50/p99 of (index applied - batch ts), same host clock.
- cold start: 16 engines holding 1M live block copies in all (16-token pages), one bridge stores
  their snapshots, then a new router (JetStreamFeed + BlockIndex) starts cold: time until it has
  read the stream and its index holds every copy. Also the stored bytes per live block.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvevents.consumers.indexer import BlockIndex  # noqa: E402
from kvevents.events import BlockStored  # noqa: E402
from kvevents.jetstream.admin import stream_report  # noqa: E402
from kvevents.jetstream.bridge import Bridge  # noqa: E402
from kvevents.jetstream.feed import JetStreamFeed  # noqa: E402
from kvevents.jetstream.link import NatsOptions  # noqa: E402
from kvevents.testing.nats import NatsServer  # noqa: E402
from kvevents.testing.zeromq import EPH  # noqa: E402
from kvevents.zeromq.engine_requests import snapshot as request_snapshot  # noqa: E402
from kvevents.zeromq.publisher import Publisher  # noqa: E402
from kvevents.zeromq.subscriber import Delivery, Source, Subscriber  # noqa: E402

PAGE = 16
TOKENS = list(range(20000, 20000 + PAGE))  # 3-byte token ids, as a 32k vocabulary gives


def _stored(h: int) -> BlockStored:
    return BlockStored([h], None, TOKENS, PAGE, None, "GPU", None)


class _Router:
    """A BlockIndex fed by poll(); records apply latency per live batch."""

    def __init__(self, src) -> None:
        self.src = src
        self.index = BlockIndex()
        self.last: dict[str, int] = {}
        self.lat: list[float] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for it in self.src.poll(0.01):
                if isinstance(it, Delivery):
                    self.index.apply(it.source, it.batch)
                    self.last[it.source] = it.seq
                    if it.kind == "live" and it.batch.events:
                        self.lat.append(time.time() - it.batch.ts)
                else:
                    self.index.drop_source(it.source, it.dp_rank)

    def wait_seq(self, name: str, seq: int, timeout: float = 120.0) -> float:
        deadline = time.monotonic() + timeout
        while self.last.get(name, -1) < seq:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"router never reached {name} seq {seq} (at {self.last.get(name)}; {self.src.counters()})"
                )
            time.sleep(0.001)
        return time.time()


TRUST: dict = {}  # {"sign_key": SignKey} with --sign: given to every Bridge and JetStreamFeed


def _paths(url: str, pub: Publisher, name: str):
    """(label, router, closer) for the direct ZeroMQ path and the JetStream path."""
    sub = Subscriber([Source(pub.endpoint, pub.replay_endpoint, name)], request_timeout_s=1.0)
    yield "zmq", _Router(sub), sub.stop
    bridge = Bridge(
        [Source(pub.endpoint, pub.replay_endpoint, name)], name, NatsOptions(url), snapshot_every_s=3600, **TRUST
    )
    bridge.start()
    bridge.wait_connected(10)
    src = JetStreamFeed(NatsOptions(url), name, **TRUST)
    yield "nats", _Router(src), lambda: (src.stop(), bridge.stop())


def run_path(url: str, label: str, n: int, rate: float) -> dict:
    pub = Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.2)
    name = f"b{label}"
    out: dict = {}
    for path, router, closer in _paths(url, pub, name):
        if path != label:
            closer()
            continue
        router.t.start()
        try:
            router.wait_seq(name, pub.publish([]), 30)  # joined
            base = 10_000_000
            # throughput
            t0 = time.time()
            for i in range(n):
                last = pub.publish([_stored(base + i)])
            t1 = router.wait_seq(name, last)
            out["batches_per_s"] = n / (t1 - t0)
            # latency at a paced rate
            router.lat.clear()
            m = int(rate * 3)
            start = time.perf_counter()
            for i in range(m):
                wait = start + i / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)  # sleeping, not spinning: the router thread needs the GIL
                last = pub.publish([_stored(base + n + i)])
            router.wait_seq(name, last)
            lat = sorted(router.lat)
            out["p50_ms"] = 1000 * lat[len(lat) // 2]
            out["p99_ms"] = 1000 * lat[int(len(lat) * 0.99)]
            out["latency_rate"] = rate
        finally:
            router.stop.set()
            router.t.join(2)
            closer()
    pub.close()
    return out


def cold_start(url: str, copies: int, sources: int) -> dict:
    per = copies // sources
    pubs = [Publisher(endpoint=EPH, replay_endpoint=EPH, heartbeat_interval_s=0.5) for _ in range(sources)]
    t0 = time.time()
    for k, p in enumerate(pubs):
        h = (k + 1) * 100_000_000
        for j in range(0, per, 512):
            nb = min(512, per - j)
            p.publish([BlockStored(list(range(h + j, h + j + nb)), None, TOKENS * nb, PAGE, None, "GPU", None)])
    fill_s = time.time() - t0
    srcs = [Source(p.endpoint, p.replay_endpoint, f"e{k}") for k, p in enumerate(pubs)]
    bridge = Bridge(srcs, "COLD", NatsOptions(url), snapshot_every_s=3600, request_timeout_s=10.0, **TRUST)
    bridge.start()
    bridge.wait_connected(10)
    t0 = time.time()
    while bridge.counters().get("snapshots_stored", 0) < sources:
        if time.time() - t0 > 300:
            raise SystemExit(f"snapshots not stored: {bridge.counters()}")
        time.sleep(0.05)
    store_s = time.time() - t0
    rep = stream_report(NatsOptions(url), "COLD")
    parts, _ = request_snapshot(pubs[0].replay_endpoint)  # one engine's snapshot: its bytes per live block
    snap_bytes_per_block = sum(len(p) for p in parts) / per
    src = JetStreamFeed(NatsOptions(url), "COLD", **TRUST)
    index = BlockIndex()
    t0 = time.time()
    read_at = None
    while len(index) < copies or read_at is None:
        for it in src.poll(0.01):
            if isinstance(it, Delivery):
                index.apply(it.source, it.batch)
            else:
                index.drop_source(it.source, it.dp_rank)
        if read_at is None and src.synced:
            read_at = time.time()
        if time.time() - t0 > 300:
            raise SystemExit(f"cold start incomplete: {len(index)} of {copies} copies; {src.counters()}")
    cold = time.time() - t0
    src.stop()
    bridge.stop()
    for p in pubs:
        p.close()
    return {
        "copies": copies,
        "sources": sources,
        "cold_start_s": cold,
        "read_s": read_at - t0,
        "snapshots_store_s": store_s,
        "engine_fill_s": fill_s,
        "stream_bytes": rep.bytes,
        "stream_bytes_per_block": rep.bytes / copies,
        "snapshot_bytes_per_block": snap_bytes_per_block,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--sign", action="store_true", help="bridges sign every message, routers verify (--sign-key)")
    args = ap.parse_args()
    if args.sign:
        from kvevents.jetstream.signing import SignKey

        TRUST["sign_key"] = SignKey.generate()
    n = 5000 if args.quick else 20000
    copies = 100_000 if args.quick else 1_000_000
    with tempfile.TemporaryDirectory() as d, NatsServer(d) as srv:
        res = {
            "zmq": run_path(srv.url, "zmq", n, 1000.0),
            "nats": run_path(srv.url, "nats", n, 1000.0),
            "cold": cold_start(srv.url, copies, 16),
            "batches": n,
        }
    if args.json:
        print(json.dumps(res))
        return
    print(f"{n} one-block batches, then 3 s paced at 1000 batches/s (latency engine ts -> index applied):")
    for k in ("zmq", "nats"):
        r = res[k]
        print(f"  {k:5s} {r['batches_per_s']:9.0f} batches/s   p50 {r['p50_ms']:6.2f} ms   p99 {r['p99_ms']:6.2f} ms")
    c = res["cold"]
    print(
        f"cold start, {c['copies']:,} live block copies across {c['sources']} sources: {c['cold_start_s']:.2f} s "
        f"(stream read {c['read_s']:.2f} s); snapshots stored in {c['snapshots_store_s']:.2f} s; "
        f"a stored snapshot takes {c['snapshot_bytes_per_block']:.0f} bytes per live block"
    )


if __name__ == "__main__":
    main()
