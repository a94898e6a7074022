"""`kvevents route`'s HTTP front under abuse (issue 28 part 2): idle sockets, a burst, large bodies.

    python3 benchmarks/bench_http_abuse.py                    # all three, about 60 s
    python3 benchmarks/bench_http_abuse.py --only large --large-seconds 10

A real `kvevents route` in its own process on 127.0.0.1 (port 0), one sim publisher (in this
process) holding a 2,048-token document; every probe is a POST /score of that document on one
kept-alive connection (send to full answer). Three scenarios, each against the same route:
- idle: `--idle` connections opened and never sent a byte (re-opened when the router closes
  them), then `--idle-seconds` of probes on fresh connections: how many were served (200);
- burst: `--burst` new connections at once, one /score each: answers by status;
- large: probe p50/p99 idle, then while another process spins on a core (the CPU control), then
  while `--large-clients` clients (threads of another process)
  post legal 4M-token bodies (16 MB) back to back: the probe's p50/p99, the large answers by
  status, the route's peak RSS.
Target: under the large-body load the probe's p99 stays within 3x of idle. Bounded counts and
time; every socket and the route process are closed at the end.

`--limits JSON` serves the same RouterService through `serve_http(..., HttpLimits(**JSON))` in a
process of its own instead of the CLI (to compare settings, or an older tree's behaviour).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from http_client import Conn  # noqa: E402 - the benchmarks' own client, beside this script

PAGE = 16
DOC_TOKENS = 2048
LARGE_TOKENS = 4_000_000
TIMEOUT_S = 30.0


def request_bytes(body: bytes) -> bytes:
    head = (
        f"POST /score HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def one_request(port: int, req: bytes) -> str:
    """A new connection, one request: its status, or the error's name."""
    try:
        conn = Conn(port, TIMEOUT_S)
        try:
            return str(conn.roundtrip(req))
        finally:
            conn.close()
    except OSError as exc:
        return type(exc).__name__


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def probe(port: int, req: bytes, seconds: float, pause_s: float = 0.002) -> tuple[list[float], Counter[str]]:
    """Probes on one kept-alive connection for `seconds`: latencies (ms) and statuses."""
    lat: list[float] = []
    codes: Counter[str] = Counter()
    conn = Conn(port, TIMEOUT_S)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            try:
                codes[str(conn.roundtrip(req))] += 1
            except OSError as exc:
                codes[type(exc).__name__] += 1
                conn.close()
                conn = Conn(port, TIMEOUT_S)
                continue
            lat.append((time.perf_counter() - t0) * 1e3)
            time.sleep(pause_s)
    finally:
        conn.close()
    return lat, codes


# ------------------------------------------------------------------ the scenarios


def idle_scenario(port: int, req: bytes, n: int, seconds: float) -> tuple[Counter[str], list[float], int]:
    """n idle sockets held open (re-opened when closed) while fresh connections probe: statuses,
    probe latencies (ms, connect included), sockets opened by the idler in all."""
    stop = threading.Event()
    held: list[socket.socket] = []
    lock = threading.Lock()
    opened = [0]

    def keeper() -> None:
        while not stop.is_set():
            with lock:
                alive = []
                for s in held:
                    try:
                        s.setblocking(False)
                        closed = s.recv(1) == b""
                    except BlockingIOError:
                        closed = False
                    except OSError:
                        closed = True
                    if closed:
                        s.close()
                    else:
                        alive.append(s)
                held[:] = alive
                while len(held) < n and not stop.is_set():
                    try:
                        held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                        opened[0] += 1
                    except OSError:
                        break
            stop.wait(0.05)

    t = threading.Thread(target=keeper)
    t.start()
    deadline = time.monotonic() + 10
    while len(held) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the server accepts them all (~0.2 s for 2,000) before the probes start
    codes: Counter[str] = Counter()
    lat: list[float] = []
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            codes[one_request(port, req)] += 1
            lat.append((time.perf_counter() - t0) * 1e3)
            time.sleep(0.02)
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
    return codes, lat, opened[0]


def burst_scenario(port: int, req: bytes, n: int) -> tuple[Counter[str], float]:
    """n new connections at once, one request each: statuses and the slowest (s)."""
    go, lock = threading.Barrier(n), threading.Lock()
    codes: Counter[str] = Counter()
    slowest = [0.0]

    def one() -> None:
        go.wait()
        t0 = time.monotonic()
        code = one_request(port, req)
        with lock:
            codes[code] += 1
            slowest[0] = max(slowest[0], time.monotonic() - t0)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes, slowest[0]


def large_body() -> bytes:
    """A legal 4M-token /score body (ids 0..999, 16,000,001 bytes, under the 16 MiB limit)."""
    rng = random.Random(28)
    return json.dumps({"tokens": [rng.randrange(1000) for _ in range(LARGE_TOKENS)]}, separators=(",", ":")).encode()


def hogs(port: int, clients: int, seconds: float) -> Counter[str]:
    """`clients` threads posting large bodies back to back for `seconds`: their answers by status."""
    big = request_bytes(large_body())
    stop = threading.Event()
    codes: Counter[str] = Counter()
    lock = threading.Lock()

    def hog() -> None:
        conn: Conn | None = None
        while not stop.is_set():
            try:
                conn = conn or Conn(port, TIMEOUT_S)
                code = str(conn.roundtrip(big))
            except OSError as exc:
                code = type(exc).__name__
                if conn is not None:
                    conn.close()
                conn = None
            with lock:
                codes[code] += 1
            if code == "503":
                stop.wait(0.05)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=hog) for _ in range(clients)]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join()
    return codes


def large_scenario(port: int, req: bytes, clients: int, seconds: float) -> tuple[list[float], Counter[str], int]:
    """Probes while `clients` post large bodies back to back (from a process of their own, so the
    probe's timing is not the hogs' GIL): probe latencies, large statuses, large answered."""
    cmd = [sys.executable, __file__, "--hogs", str(port), str(clients), str(seconds + 1.5)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "hogs started":
            raise SystemExit("the hog process did not start")
        time.sleep(1.0)  # every hog mid-body
        lat, _ = probe(port, req, seconds)
        out, _ = proc.communicate(timeout=seconds + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    codes: Counter[str] = Counter(json.loads(out.strip().splitlines()[-1]))
    return lat, codes, codes.get("200", 0)


def spin_control(port: int, req: bytes, seconds: float) -> list[float]:
    """The CPU control: probe latencies while another process spins on one core (what the box
    gives a probe when a core's worth of other work runs, whatever it is)."""
    spin = "import time\nend = time.monotonic() + %f\nwhile time.monotonic() < end: pass\n" % (seconds + 1.5)
    proc = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        lat, _ = probe(port, req, seconds)
    finally:
        proc.wait(seconds + 10)
    return lat


# ------------------------------------------------------------------ route and its publisher


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_route(extra: list[str], limits: str | None) -> tuple[subprocess.Popen, int, object]:
    """One sim publisher with a document published, `kvevents route` (or, with `limits`, this
    script's --serve) subscribed to it; (proc, port, pub)."""
    from kvevents.sim.worker import Request, SimWorker
    from kvevents.zeromq.publisher import Publisher

    worker = SimWorker("w0", page_size=PAGE, capacity_pages=4000)
    pub = Publisher(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", bind=True)
    pub.publish(worker.take_events())
    if limits is None:
        cmd = [sys.executable, "-m", "kvevents", "route", f"--publisher=w0={pub.endpoint},{pub.replay_endpoint}"]
        cmd += ["--http", "127.0.0.1:0", "--seed", "0", *extra]
    else:
        cmd = [sys.executable, __file__, "--serve", f"{pub.endpoint},{pub.replay_endpoint}", limits]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=os.environ)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "http://" not in line:
        proc.kill()
        pub.close(0)
        raise SystemExit(f"route did not start: {line}{proc.stderr.read()}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    port = int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
    doc = DOC[:]
    worker.serve(Request(doc))
    pub.publish(worker.take_events())
    return proc, port, pub


_DOC_RNG = random.Random(30)
DOC = [_DOC_RNG.randrange(32000) for _ in range(DOC_TOKENS)]


def wait_matched(port: int, req: bytes) -> None:
    conn = Conn(port, TIMEOUT_S)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            conn.sock.sendall(req)
            time.sleep(0.05)
            data = conn.sock.recv(1 << 20)
            if f'"matched_pages":{DOC_TOKENS // PAGE}'.encode() in data:
                return
        raise SystemExit("route did not index the document within 30 s")
    finally:
        conn.close()


def serve(endpoints: str, limits: str) -> None:
    """--serve: a RouterService on the publisher, HTTP with HttpLimits(**limits), until stdin closes or a signal."""
    import signal

    from kvevents.consumers.service.core import RouterService
    from kvevents.consumers.service.http_api import HttpLimits
    from kvevents.zeromq.subscriber import Source

    endpoint, replay = endpoints.split(",")
    service = RouterService([Source(endpoint, replay, "w0")], page_size=PAGE, seed=0)
    service.start()
    host, port = service.serve_http("127.0.0.1", 0, HttpLimits(max_body_bytes=16 * 1024 * 1024, **json.loads(limits)))
    print(f"kvevents route (library, limits {limits}): http://{host}:{port}", file=sys.stderr, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    service.stop()


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--hogs":  # large_scenario's clients, in a process of their own
        print("hogs started", flush=True)
        print(json.dumps(hogs(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))), flush=True)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["idle", "burst", "large"], action="append", help="scenarios (default: all)")
    ap.add_argument("--idle", type=int, default=2000, help="idle connections held open")
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--burst", type=int, default=2000, help="new connections at once")
    ap.add_argument("--large-clients", type=int, default=4)
    ap.add_argument("--large-seconds", type=float, default=15.0)
    ap.add_argument("--route-arg", action="append", default=[], help="an extra `kvevents route` argument")
    ap.add_argument("--limits", help="JSON of HttpLimits fields: serve through the library with them")
    args = ap.parse_args()
    only = set(args.only or ["idle", "burst", "large"])
    req = request_bytes(json.dumps({"tokens": DOC}).encode())
    proc, port, pub = start_route(args.route_arg, args.limits)
    try:
        wait_matched(port, req)
        how = f"limits {args.limits}" if args.limits else f"kvevents route {' '.join(args.route_arg)}"
        print(f"loopback, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {how}")
        if "idle" in only:
            codes, lat, opened = idle_scenario(port, req, args.idle, args.idle_seconds)
            print(
                f"idle: {args.idle} idle connections ({opened} opened in all), {sum(codes.values())} probes, "
                f"{codes.get('200', 0)} served: {dict(codes)}; probe p50 {_pct(lat, 0.5):.1f} / p99 {_pct(lat, 0.99):.1f} ms"
            )
        if "burst" in only:
            codes, slowest = burst_scenario(port, req, args.burst)
            print(f"burst: {args.burst} at once: {dict(codes)}, slowest {slowest:.2f} s")
        if "large" in only:
            idle_lat, _ = probe(port, req, 3.0)
            control = spin_control(port, req, 5.0)
            base_rss = rss_mb(proc.pid)
            lat, codes, done = large_scenario(port, req, args.large_clients, args.large_seconds)
            p99, idle_p99 = _pct(lat, 0.99), _pct(idle_lat, 0.99)
            print(
                f"control: probe p50 {_pct(control, 0.5):.2f} / p99 {_pct(control, 0.99):.2f} ms while a process spins on a core"
            )
            print(
                f"large: probe idle p50 {_pct(idle_lat, 0.5):.2f} / p99 {idle_p99:.2f} ms; under {args.large_clients} "
                f"clients of {LARGE_TOKENS:,}-token bodies p50 {_pct(lat, 0.5):.2f} / p99 {p99:.2f} ms "
                f"({p99 / idle_p99:.1f}x, target <= 3x: {'met' if p99 <= 3 * idle_p99 else 'MISSED'}); "
                f"large answers {dict(codes)}; route RSS {base_rss:.0f} MB before, peak {rss_mb(proc.pid, 'VmHWM'):.0f} MB"
            )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        pub.close(0.2)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
