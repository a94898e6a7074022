"""Publisher throughput and latency over loopback, against the raw pyzmq ceiling and a vLLM-style baseline.

    python benchmarks/bench_publisher.py            # everything (about 40 s)
    python benchmarks/bench_publisher.py --quick    # smaller runs

Every design sends to a separate receiver process (a raw SUB socket counting the measured seqs),
so figures are "publisher -> subscriber process" batches/s as the receiver sees them:
- ceiling: raw `send_multipart` of pre-encoded frames (the same payloads, encoded beforehand);
- ours: `Publisher.publish(events)` with a replay endpoint and `snapshots=False` (encode + seq +
  replay ring + ROUTER, caller thread): vLLM's feature set, the figure issue 4 asks >= 80% of;
- ours+snapshot: the same with `snapshots=True` (the default): plus the live view for KVE/SNAPSHOT;
- ours-queue: `ours` with `send_mode="queue"` (bounded queue + sender thread);
- vllm-style: blocking `Queue.put` + one sender thread encoding and sending one batch at a time.
Latency: ours (no replay endpoint) at a paced 10k batches/s to a receiver running our Subscriber;
p50/p99 of `Delivery.received_at - batch.ts` (same host clock).

Three full runs (2 cores, --repeat 3, one benchmark at a time), % of ceiling:
                    1-event batches    32-event batches
    ours            107 116 106        91 82 83
    ours+snapshot   107 113 111        68 67 73
    ours-queue       97  86  95        64 60 69
    vllm-style       80  80  81        73 69 71
Two more `--sizes 32 --designs ours,ours+snapshot` runs gave ours 86 and 91, ours+snapshot 73
and 78: ours meets the 80% in every run since publish encodes into a scratch buffer (82-91%).
Caller-thread sending beats the queue + sender thread, so `publish()` sends on the caller's thread
under a lock. Designs run interleaved (a busy spell hits them all); still, single runs of the same
code vary by +-10 points on a shared box: run it twice. The ceiling is the receiver's pace (its
sender alone goes faster), so the percentages say how much of the 2 cores the publisher leaves to
the receiver process and ZeroMQ's I/O threads.

Per 32-event batch in-process (no receiver; best of interleaved runs): `publish` costs ~5.3-5.5 us
without the view and ~9-10.7 us with it. msgpack encoding is ~3.1 us (fixed by the wire format;
`encode_into` a reused buffer plus one copy saves ~0.3 us over `encode()`'s growing buffer),
the three compiled sends ~0.6 us (the ceiling's
`send_multipart` costs ~4.1 us, which is why 1-event batches beat it), keeping the last 10,000
payloads for replay ~0.6 us (fresh memory for every payload), locking and bookkeeping the rest.
The view (`LiveView.apply`, ~3.1 us alone, 3.5-5 us inside publish; ~3.5 us alone before) is
about 100 ns per single-page event (class test, medium, page, one dict operation): that is what
separates ours+snapshot from ours. kvevents/zeromq/view.py says what else was tried.
Options: --sizes 32 --designs ours,ours+snapshot --no-latency for a quick look at two figures.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq  # noqa: E402

from kvevents.events import BatchEncoder, BlockRemoved, BlockStored  # noqa: E402
from kvevents.zeromq.publisher import Publisher  # noqa: E402
from kvevents.zeromq.wire import SEQ  # noqa: E402

HWM = 1_000_000
POOL = 512  # distinct store batches; each is later removed, so the snapshot view stays bounded


# ------------------------------------------------------------------ receiver process


def receiver(endpoint: str, mode: str) -> None:
    """Count seqs in [s0, s0 + n) (s0 and n read from stdin after 'ready'), print a JSON result."""
    ctx = zmq.Context.instance()
    if mode == "sub":
        return _receiver_sub(endpoint)
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.RCVHWM, HWM)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(endpoint)
    s.recv_multipart()
    print("ready", flush=True)
    s0, n = map(int, sys.stdin.readline().split())
    end = s0 + n
    got = 0
    first = last = 0.0
    unpack = SEQ.unpack
    while s.poll(3000):
        frames = s.recv_multipart()
        seq = unpack(frames[1])[0]
        if s0 <= seq < end:
            if not got:
                first = time.perf_counter()
            got += 1
            last = time.perf_counter()
            if seq == end - 1:
                break
    print(json.dumps({"received": got, "seconds": last - first}), flush=True)


def _receiver_sub(endpoint: str) -> None:
    from kvevents.zeromq.subscriber import Source, Subscriber

    sub = Subscriber([Source(endpoint)], hwm=HWM)
    while not sub.poll(0.05):
        pass
    print("ready", flush=True)
    s0, n = map(int, sys.stdin.readline().split())
    lat = []
    idle = time.monotonic()
    while time.monotonic() - idle < 3:
        for d in sub.poll(0.01):
            idle = time.monotonic()
            if d.seq >= s0 and d.batch.events:
                lat.append(d.received_at - d.batch.ts)
        if len(lat) >= n:
            break
    sub.stop()
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3 if lat else float("nan")  # noqa: E731
    print(json.dumps({"received": len(lat), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": q(1.0)}), flush=True)


def _spawn(endpoint: str, mode: str = "raw") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--recv", endpoint, "--recv-mode", mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _handshake(proc: subprocess.Popen, warm) -> None:
    """Send warm-up batches until the receiver says it is subscribed (slow-joiner problem)."""
    assert proc.stdout is not None
    box: list[str] = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    while t.is_alive():
        warm()
        time.sleep(0.005)
    if box[0].strip() != "ready":
        raise RuntimeError(f"receiver failed: {box}")


def _result(proc: subprocess.Popen) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.wait(10)
    return json.loads(line)


# ------------------------------------------------------------------ workloads


def make_batches(events_per_batch: int) -> list[list]:
    """2 * POOL event lists: stores of distinct pages, then their removes (steady-state view)."""
    stores, removes = [], []
    for b in range(POOL):
        evs = [
            BlockStored([b * 1000 + i + 1], None, list(range(16)), 16, None, "GPU", None)
            for i in range(events_per_batch)
        ]
        stores.append(evs)
        removes.append([BlockRemoved(e.block_hashes, "GPU") for e in evs])
    return stores + removes


# ------------------------------------------------------------------ designs


def run_ceiling(batches: list[list], n: int) -> dict:
    enc = BatchEncoder("map")
    payloads = [enc.encode(1.0, evs, 0, 1) for evs in batches]
    seqs = [SEQ.pack(i) for i in range(n + 1000)]
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, HWM)
    pub.setsockopt(zmq.LINGER, 2000)
    pub.bind("tcp://127.0.0.1:*")
    proc = _spawn(pub.getsockopt_string(zmq.LAST_ENDPOINT))
    warm_i = [n]  # warm-up uses seqs beyond the measured range

    def warm() -> None:
        pub.send_multipart((b"", seqs[warm_i[0]], payloads[0]))
        warm_i[0] = min(warm_i[0] + 1, n + 999)

    _handshake(proc, warm)
    proc.stdin.write(f"0 {n}\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    time.sleep(0.05)
    m = len(payloads)
    send = pub.send_multipart
    t0 = time.perf_counter()
    for i in range(n):
        send((b"", seqs[i], payloads[i % m]))
    sent = time.perf_counter() - t0
    res = _result(proc)
    pub.close()
    return {**res, "send_seconds": sent}


def run_ours(batches: list[list], n: int, send_mode: str = "caller", snapshots: bool = False) -> dict:
    """Publisher with a replay endpoint (ring + ROUTER); `snapshots` adds the live view."""
    pub = Publisher(
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        hwm=HWM,
        heartbeat_interval_s=0,
        send_mode=send_mode,
        max_queue_size=100000,  # type: ignore[arg-type]
        snapshots=snapshots,
    )
    proc = _spawn(pub.endpoint)
    _handshake(proc, lambda: pub.publish([]))
    if send_mode == "queue":
        while pub._pending:  # batches enqueued, not yet sent (the sender does not call task_done)
            time.sleep(0.001)
    s0 = pub.stats()["next_seq"]
    proc.stdin.write(f"{s0} {n}\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    time.sleep(0.05)
    m = len(batches)
    publish = pub.publish
    t0 = time.perf_counter()
    for i in range(n):
        publish(batches[i % m], 1.0)
    if send_mode == "queue":
        while pub._pending:  # batches enqueued, not yet sent (the sender does not call task_done)
            time.sleep(0.0005)
    sent = time.perf_counter() - t0
    res = _result(proc)
    dropped = pub.stats()["dropped_queue_full"]
    pub.close(2.0)
    return {**res, "send_seconds": sent, "dropped": dropped}


def run_vllm_style(batches: list[list], n: int) -> dict:
    """Blocking Queue.put on the caller; one thread encodes and sends one batch at a time."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.bind("tcp://127.0.0.1:*")
    q: queue.Queue = queue.Queue(maxsize=100000)
    enc = BatchEncoder("map")
    state = {"seq": 0}

    def sender() -> None:
        while True:
            item = q.get()
            if item is None:
                q.task_done()
                return
            ts, evs = item
            payload = enc.encode(ts, evs, 0)
            sock.send_multipart((b"", SEQ.pack(state["seq"]), payload))
            state["seq"] += 1
            q.task_done()

    th = threading.Thread(target=sender, daemon=True)
    th.start()
    proc = _spawn(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    _handshake(proc, lambda: q.put((1.0, [])))
    q.join()
    s0 = state["seq"]
    proc.stdin.write(f"{s0} {n}\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    time.sleep(0.05)
    m = len(batches)
    put = q.put
    t0 = time.perf_counter()
    for i in range(n):
        put((1.0, batches[i % m]))
    q.join()
    sent = time.perf_counter() - t0
    res = _result(proc)
    q.put(None)
    th.join()
    sock.close()
    return {**res, "send_seconds": sent}


def run_latency(rate: float, seconds: float) -> dict:
    pub = Publisher(endpoint="tcp://127.0.0.1:*", hwm=HWM, heartbeat_interval_s=0)
    proc = _spawn(pub.endpoint, "sub")
    _handshake(proc, lambda: pub.publish([]))
    n = int(rate * seconds)
    s0 = pub.stats()["next_seq"]
    proc.stdin.write(f"{s0} {n}\n")  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    time.sleep(0.1)
    batches = make_batches(1)
    m = len(batches)
    t0 = time.perf_counter()
    i = 0
    while i < n:  # publish what is due, then sleep ~0.2 ms (an engine step, not a spinning core)
        due = min(n, int((time.perf_counter() - t0) * rate) + 1)
        while i < due:
            pub.publish(batches[i % m])
            i += 1
        time.sleep(0.0002)
    achieved = n / (time.perf_counter() - t0)
    res = _result(proc)
    pub.close()
    return {**res, "achieved_rate": achieved}


def _rate(r: dict) -> float:
    return r["received"] / r["seconds"] if r.get("seconds") else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recv")
    ap.add_argument("--recv-mode", default="raw")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs per design; the best is reported")
    ap.add_argument("--sizes", default="1,32", help="events per batch to measure (comma-separated: 1, 32)")
    ap.add_argument(
        "--designs", default="ceiling,ours,ours+snapshot,ours-queue,vllm-style", help="designs to run (ceiling always)"
    )
    ap.add_argument("--no-latency", action="store_true", help="skip the latency run")
    args = ap.parse_args()
    if args.recv:
        return receiver(args.recv, args.recv_mode)
    counts = {1: 20000 if args.quick else 100000, 32: 5000 if args.quick else 30000}
    sizes = {int(k): counts.get(int(k), 30000) for k in args.sizes.split(",")}
    designs = {
        "ceiling": lambda b, n: run_ceiling(b, n),
        "ours": lambda b, n: run_ours(b, n, "caller"),
        "ours+snapshot": lambda b, n: run_ours(b, n, "caller", snapshots=True),
        "ours-queue": lambda b, n: run_ours(b, n, "queue"),
        "vllm-style": lambda b, n: run_vllm_style(b, n),
    }
    wanted = {"ceiling", *args.designs.split(",")}
    designs = {k: v for k, v in designs.items() if k in wanted}
    print(f"{'events/batch':>12} {'design':>13} {'batches/s':>11} {'of ceiling':>10} {'received':>9} {'sender/s':>11}")
    for epb, n in sizes.items():
        batches = make_batches(epb)
        runs: dict[str, list[dict]] = {name: [] for name in designs}
        for _ in range(max(1, args.repeat)):  # interleaved, so a busy spell on a shared box hits every design
            for name, fn in designs.items():
                runs[name].append(fn(batches, n))
        results = {name: max(rs, key=_rate) for name, rs in runs.items()}
        ceiling = _rate(results["ceiling"])
        for name, r in results.items():
            print(
                f"{epb:>12} {name:>13} {_rate(r):>11,.0f} {_rate(r) / ceiling:>10.0%} {r['received']:>9} "
                f"{n / r['send_seconds']:>11,.0f}",
                flush=True,
            )
    if args.no_latency:
        return
    lat = run_latency(10000.0, 2.0 if args.quick else 5.0)
    print(
        f"latency at 10k batches/s (achieved {lat['achieved_rate']:,.0f}/s, {lat['received']} batches, our Subscriber): "
        f"p50 {lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms, max {lat['max_ms']:.3f} ms"
    )


if __name__ == "__main__":
    main()
