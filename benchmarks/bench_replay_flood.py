"""Live `publish()` latency while the replay ROUTER is flooded (issue 18, items 1-3).

    python3 benchmarks/bench_replay_flood.py              # idle + every flood, ~4 s each
    python3 benchmarks/bench_replay_flood.py --seconds 2  # shorter phases
    python3 benchmarks/bench_replay_flood.py --seconds 2 --repeat 3   # the figures in benchmarks/README.md

One publisher (replay endpoint on, snapshots on, ring filled with 10,000 batches of 32 events)
publishes a 32-event batch every millisecond on this process's main thread; each `publish()` is
timed. Phases, each against the same publisher, the flood coming from a separate process so it
does not share our interpreter:
- idle: nobody on the ROUTER;
- replay-hog: 8 DEALERs each send 64 replay-from-0 requests every 100 ms and never reads (item 1);
- hog-many: the same from 32 DEALERs (128 requests held at once > replay_max_jobs 64);
- describe: 8 DEALERs send KVE/DESCRIBE as fast as they can and never reads (item 2);
- describe-one: one DEALER sends KVE/DESCRIBE as fast as it can and reads every answer (issue 28);
- multiframe: 8 DEALERs send 20,000-frame requests of 200-byte frames (4 MB each) in a loop (item 3).
During every phase a well-behaved probe DEALER (in the flooder process) asks every 250 ms for a
replay of the newest 5 batches; "probes" counts those answered whole within 2 s. The table gives
publish p50/p99/max, the p99 ratio to the idle phase just before (target <= 2x), probes answered, and this process's
RSS before the flood, right after it, and once the ROUTER has drained what the flood left queued
(counters still for 0.5 s), with the seconds that took.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zmq  # noqa: E402

from kvevents.events import BlockRemoved, BlockStored  # noqa: E402
from kvevents.zeromq.publisher import Publisher  # noqa: E402
from kvevents.zeromq.wire import DESCRIBE_REQUEST, END_SEQ, SEQ  # noqa: E402

FLOODS = ("replay-hog", "hog-many", "describe", "describe-one", "multiframe")


def _batch(i: int) -> list:
    """32 one-page stores (even i), then their removal (odd i): the snapshot view stays small."""
    hashes = [(i // 2 % 512) * 32 + k for k in range(32)]
    if i % 2:
        return [BlockRemoved([h], None) for h in hashes]
    return [BlockStored([h], None, [h % 1000] * 16, 16, None, None, None) for h in hashes]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0  # pragma: no cover - not Linux


# ------------------------------------------------------------------ flooder process

PEERS = 8  # flooding DEALERs (identities) per flood


def _probe(ctx: zmq.Context, endpoint: str) -> bool:
    """A well-behaved peer (fresh identity): DESCRIBE, then replay the newest 5 batches, 2 s each."""
    import msgspec

    probe = ctx.socket(zmq.DEALER)
    probe.setsockopt(zmq.LINGER, 0)
    probe.connect(endpoint)
    try:
        probe.send_multipart([b"", DESCRIBE_REQUEST])
        if not probe.poll(2000):
            return False
        newest = msgspec.msgpack.decode(probe.recv_multipart()[-1])["newest_seq"]
        probe.send_multipart([b"", SEQ.pack(max(0, newest - 4))])
        deadline = time.monotonic() + 2.0
        got = 0
        while time.monotonic() < deadline:
            if not probe.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                return False
            frames = probe.recv_multipart()
            if frames[-2] == END_SEQ:  # the end marker
                return got >= 5
            got += 1
        return False
    finally:
        probe.close(0)


def flooder(kind: str, endpoint: str, seconds: float) -> None:
    """Flood `endpoint` for `seconds` while probing it; print one JSON line (probes sent/answered)."""
    ctx = zmq.Context()
    bads = []
    for _ in range(32 if kind == "hog-many" else 1 if kind == "describe-one" else PEERS):
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        if kind != "describe-one":
            bad.setsockopt(zmq.RCVHWM, 10)  # never read: let the publisher's side fill up
        bad.connect(endpoint)
        bads.append(bad)
    stop = threading.Event()

    def flood() -> None:
        frame = b"x" * 200
        big = [b""] + [frame] * 20_000
        while not stop.is_set():
            for bad in bads:
                try:
                    if kind in ("replay-hog", "hog-many"):
                        for _ in range(64):
                            bad.send_multipart([b"", SEQ.pack(0)], zmq.NOBLOCK)
                    elif kind == "describe":
                        for _ in range(100):
                            bad.send_multipart([b"", DESCRIBE_REQUEST], zmq.NOBLOCK)
                    elif kind == "describe-one":  # reads its answers: never back-pressured
                        while bad.poll(0):
                            bad.recv_multipart()
                        for _ in range(100):
                            bad.send_multipart([b"", DESCRIBE_REQUEST], zmq.NOBLOCK)
                    else:
                        bad.send_multipart(big, zmq.NOBLOCK)
                except zmq.Again:
                    pass
            stop.wait(0.1 if kind in ("replay-hog", "hog-many") else 0.0 if kind == "describe-one" else 0.001)

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    sent = answered = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sent += 1
        answered += _probe(ctx, endpoint)
        time.sleep(0.25)
    stop.set()
    t.join(2)
    print(json.dumps({"probes": sent, "answered": answered}), flush=True)
    ctx.destroy(0)


# ------------------------------------------------------------------ measuring side


def _measure(pub: Publisher, seconds: float, base: int) -> list[float]:
    out = []
    i = base
    nxt = time.perf_counter()
    end = nxt + seconds
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if now < nxt:
            time.sleep(max(0.0, nxt - now - 0.0002))
            continue
        nxt += 0.001
        ev = _batch(i)
        t0 = time.perf_counter_ns()
        pub.publish(ev)
        out.append((time.perf_counter_ns() - t0) / 1000)
        i += 1
    return out


def _drained(pub: Publisher, timeout: float = 20.0) -> None:
    """Wait until the ROUTER's counters stop moving for 0.5 s (what the flood queued is handled)."""
    keys = ("rejected_requests", "describe_requests", "replay_requests", "replies_abandoned")
    last, since = None, time.monotonic()
    end = since + timeout
    while time.monotonic() < end:
        now = tuple(pub.stats()[k] for k in keys)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.5:
            return
        time.sleep(0.05)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each phase")
    ap.add_argument("--floods", default=",".join(FLOODS))
    ap.add_argument(
        "--repeat", type=int, default=1, help="idle/flood pairs per flood (the summary gives the median ratio)"
    )
    ap.add_argument("--budget-us", type=float, help="override router.TURN_BUDGET_S (experiments)")
    ap.add_argument("--yield-us", type=float, help="override router.YIELD_S (experiments)")
    ap.add_argument("--switch-us", type=float, help="sys.setswitchinterval for this process (experiments)")
    ap.add_argument("--flooder", nargs=3, metavar=("KIND", "ENDPOINT", "SECONDS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flooder:
        return flooder(args.flooder[0], args.flooder[1], float(args.flooder[2]))
    from kvevents.zeromq import replay_server as router

    if args.budget_us is not None:
        router.TURN_BUDGET_S = args.budget_us / 1e6
    if args.yield_us is not None:
        router.YIELD_S = args.yield_us / 1e6
    if args.switch_us is not None:
        sys.setswitchinterval(args.switch_us / 1e6)
    pub = Publisher(
        endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", bind=True, heartbeat_interval_s=0
    )
    try:
        print(
            f"turn budget {router.TURN_BUDGET_S * 1e6:g} us, yield {router.YIELD_S * 1e6:g} us, "
            f"switch interval {sys.getswitchinterval() * 1e6:g} us"
        )
        for i in range(10_000):
            pub.publish(_batch(i))
        print(f"publish() of a 32-event batch every 1 ms, {args.seconds:g} s per phase; ring 10,000 batches;")
        print("each flood is preceded by an idle phase (p99/idle compares the two); RSS of this process")
        print(
            f"{'flood':<12} {'idle p99':>9} {'p50 us':>7} {'p99 us':>7} {'max us':>8} {'p99/idle':>9} {'probes':>7} "
            f"{'RSS before':>10} {'after':>6} {'later':>6} {'(s)':>6}"
        )
        seq = 0
        ratios: dict[str, list[float]] = {}
        for kind in [k for k in args.floods.split(",") if k] * max(1, args.repeat):
            idle = _measure(pub, args.seconds, seq)
            seq += len(idle)
            rss0 = _rss_mb()
            proc = subprocess.Popen(
                [sys.executable, __file__, "--flooder", kind, pub.replay_endpoint or "", str(args.seconds + 1.0)],
                stdout=subprocess.PIPE,
                text=True,
            )
            time.sleep(1.0)  # let the flood build up
            lat = _measure(pub, args.seconds, seq)
            seq += len(lat)
            out, _ = proc.communicate(timeout=60)
            rss1 = _rss_mb()
            t_end = time.monotonic()
            _drained(pub)
            rss2, drain_s = _rss_mb(), time.monotonic() - t_end
            probes = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"answered": 0, "probes": 0}
            p99_idle = _pct(idle, 0.99)
            ratios.setdefault(kind, []).append(_pct(lat, 0.99) / p99_idle)
            print(
                f"{kind:<12} {p99_idle:>9.1f} {_pct(lat, 0.5):>7.1f} {_pct(lat, 0.99):>7.1f} {max(lat):>8.1f} "
                f"{_pct(lat, 0.99) / p99_idle:>8.2f}x {probes['answered']:>3}/{probes['probes']:<3} "
                f"{rss0:>10.0f} {rss1:>6.0f} {rss2:>6.0f} {drain_s:>6.1f}",
                flush=True,
            )
        print("stats:", {k: v for k, v in pub.stats().items() if v and k not in ("bytes_sent",)})
        if args.repeat > 1:
            print("median p99/idle:", ", ".join(f"{k} {sorted(v)[len(v) // 2]:.2f}x" for k, v in ratios.items()))
    finally:
        pub.close(0)


if __name__ == "__main__":
    main()
