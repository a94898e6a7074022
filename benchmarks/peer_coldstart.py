"""A router's cold start from NATS JetStream: `kvevents route --nats` reading a scale point's index.

    python3 benchmarks/peer_coldstart.py --workers 1024 --copies 10M [--via log|bridge|log,bridge] [--json]
    python3 benchmarks/peer_coldstart.py --workers 64 --copies 1M        # a quick run

The point's batches are built as bench_peer.py builds them (bench_consumers' shared profile,
random.Random(0), 400 documents of 512 pages) and written as a record log (bench_peer.write_log,
in a child process, so this one stays small). Then, for comparison, the record-log cold start
(peer_scale.cold_start: `kvevents log index LOG`) and `cold_start_nats` for each path asked for
(the default: both; benchmarks/jetstream_fill.py fills the stream, untimed):

- `log`: the log's 16-page batches stored once each in the bridge's message layout (its
  subjects, headers and Nats-Msg-Id, from the library's public names), no snapshot: the router
  reads every batch since each source's seq 0. It holds exactly what `log index` applies (same
  batches, same copies), so the two cold starts compare; the library has no seam that publishes
  given batches (the Bridge's only input is ZeroMQ engines). A cold start's worst case.
- `bridge`: the fleet itself, engines -> Bridge -> JetStream: a real zeromq Publisher per source
  (benchmarks/fleet_engines.py, a child process), one real Bridge storing their history and
  heartbeats (one a second per engine, the default) and, once it is past every engine's last
  batch, a snapshot of every source; the router reads the snapshots and the tail after them (the
  steady state a fleet's router starts in). Its copies are what the engines' snapshots hold. Its
  fill takes minutes at 10M copies; there the bridge's Subscriber resyncs most engines by
  snapshot on first contact (their replay takes over 10 s), so little history is stored.

What is timed is the router only: from starting `python -m kvevents route --nats URL --insecure
--key-mode contract --http 127.0.0.1:0` (a child process; `--key-mode contract` because the
benchmark's batches carry the contract's event hashes and no token ids; `--insecure` because the
stream is unsigned; the default --max-sources 4096 covers 1,024 sources) until GET /workers reports
every copy in its index (polled every 0.25 s, time.monotonic()). Then its VmRSS (holding the
index; again 5 s later) and VmHWM (peak) from /proc, its feed's counters (GET /metrics), and it is
stopped (SIGTERM). nats-server runs on loopback with its own store in a temporary directory (max
file store 16 GB).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from jetstream_fill import fill_from_log, fill_via_bridge, stream_state  # noqa: E402

from kvevents.testing.nats import NatsServer  # noqa: E402

__all__ = ["cold_start_nats", "expected_copies", "route_cold_start", "ROUTE_ARGS"]

STREAM = "COLD"
#: The flags of the timed command after `--nats URL --stream STREAM` (see the module docstring).
ROUTE_ARGS = ("--insecure", "--key-mode", "contract", "--http", "127.0.0.1:0")
POLL_S = 0.25
SETTLE_S = 5.0  # after the index is complete: the RSS read again this much later
_BANNER = re.compile(r"-> https?://([0-9.]+):([0-9]+)")
_NATS_CONF = "jetstream {\n  max_file_store: 16GB\n  max_memory_store: 256MB\n}\n"


def expected_copies(log_path: str) -> int:
    """The copies a router holds after every batch of the log (what `kvevents log index` reports)."""
    from kvevents.consumers.indexer import BlockIndex
    from kvevents.recordlog.replay import apply_log

    index = BlockIndex()
    apply_log(log_path, index.apply, lambda src, rank: index.drop_source(src, rank))
    return len(index)


def _route_env() -> dict[str, str]:
    """The child's environment: this tree's kvevents first on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _bound_port(err_path: Path, proc: subprocess.Popen, deadline: float) -> int:
    """The HTTP port route announces on stderr (it binds port 0 itself)."""
    while time.monotonic() < deadline:
        m = _BANNER.search(err_path.read_text(errors="replace"))
        if m:
            return int(m.group(2))
        if proc.poll() is not None:
            raise RuntimeError(f"route exited {proc.returncode}: {err_path.read_text()[-2000:]}")
        time.sleep(0.02)
    raise RuntimeError("route announced no HTTP address in time")


def _index_stats(port: int) -> dict:
    """GET /workers's `index` part: copies, entries, workers and the index counters."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30.0)
    try:
        conn.request("GET", "/workers")
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET /workers: {resp.status} {body[:200]!r}")
        return json.loads(body)["index"]
    finally:
        conn.close()


def _memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a live process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(rest.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10.0)


def _feed_counters(port: int) -> dict[str, int]:
    """The JetStream feed's counters, from GET /metrics (messages read, snapshot batches, duplicates...)."""
    from kvevents.consumers.service.metrics import METRIC_NAMES

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30.0)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    pat = re.compile(re.escape(METRIC_NAMES["subscriber"]) + r'\{counter="([^"]+)"\} ([0-9.e+]+)')
    return {m.group(1): int(float(m.group(2))) for m in pat.finditer(text)}


def _until_held(port: int, proc: subprocess.Popen, copies: int, t0: float, deadline: float, err_path: Path):
    """Poll GET /workers until the index holds `copies`: (its last `index` part, [(s, copies, VmRSS)] every ~2 s)."""
    samples: list[tuple[float, int, int]] = []
    stats = _index_stats(port)
    while stats["copies"] < copies:
        now = time.monotonic()
        if now > deadline or proc.poll() is not None:
            raise RuntimeError(
                f"route holds {stats['copies']:,} of {copies:,} copies after {now - t0:.0f} s "
                f"(exit {proc.poll()}): {err_path.read_text(errors='replace')[-1500:]}"
            )
        if not samples or now - t0 - samples[-1][0] >= 2.0:
            samples.append((round(now - t0, 1), stats["copies"], _memory(proc.pid)[0]))
        time.sleep(POLL_S)
        stats = _index_stats(port)
    return stats, samples


def route_cold_start(url: str, stream: str, copies: int, timeout_s: float = 1800.0) -> dict:
    """Start `kvevents route --nats` and time it until its index holds `copies`; its memory then
    (and SETTLE_S later, once what the feed buffered is freed), its feed's counters."""
    cmd = [sys.executable, "-m", "kvevents", "route", "--nats", url, "--stream", stream, *ROUTE_ARGS]
    with tempfile.TemporaryDirectory() as tmp:
        err_path = Path(tmp) / "route.stderr"
        with open(err_path, "wb") as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=_route_env())
        try:
            port = _bound_port(err_path, proc, t0 + timeout_s)
            http_s = time.monotonic() - t0
            stats, samples = _until_held(port, proc, copies, t0, t0 + timeout_s, err_path)
            wall = time.monotonic() - t0
            rss, hwm = _memory(proc.pid)
            time.sleep(SETTLE_S)
            settled = _memory(proc.pid)[0]
            feed = _feed_counters(port)
        finally:
            _stop(proc)
    return {
        "command": " ".join(["kvevents route --nats URL --stream", stream, *ROUTE_ARGS]),
        "copies": stats["copies"],
        "entries": stats["entries"],
        "wall_s": round(wall, 2),
        "http_up_s": round(http_s, 2),
        "rss_bytes": rss,
        "peak_rss_bytes": hwm,
        "rss_settled_bytes": settled,
        "rss_samples": samples,
        "index": stats,
        "feed": feed,
    }


def cold_start_nats(log_path: str, via: str = "log", copies: int | None = None) -> dict:
    """A route's cold start from JetStream holding the log's batches, stored the `via` way ("log" or
    "bridge", see the module docstring). `copies`: what the log's index holds, if known (log path)."""
    if via not in ("log", "bridge"):
        raise ValueError(f"via must be 'log' or 'bridge', got {via!r}")
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "nats.conf"
        conf.write_text(_NATS_CONF)
        srv = NatsServer(tmp, config=str(conf))
        srv.start()
        try:
            t0 = time.monotonic()
            if via == "log":
                fill = fill_from_log(srv.url, STREAM, log_path)
                target = copies if copies is not None else expected_copies(log_path)
            else:
                fill = fill_via_bridge(srv.url, STREAM, log_path)
                target = fill["copies"]
            fill_s = time.monotonic() - t0
            state = stream_state(srv.url, STREAM)
            out = route_cold_start(srv.url, STREAM, target)
        finally:
            srv.stop()
    return {
        "via": via,
        **out,
        "stream_bytes": state["bytes"],
        "messages": state["messages"],
        "fill_s": round(fill_s, 1),
        "fill": fill,
    }


def _parse_copies(text: str) -> int:
    mult = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    return int(float(text.rstrip("kKmM")) * mult)


def _print(name: str, r: dict) -> None:
    if "records" in r:
        print(
            f"{name}: {r['copies']:,} copies from {r['records']:,} records ({r['log_bytes'] / 1e6:.0f} MB log): "
            f"{r['wall_s']} s wall ({r['apply_s']} s reading and applying), peak RSS {r['peak_rss_bytes'] / 1e6:,.0f} MB"
        )
        return
    print(
        f"{name} ({r['command']}): {r['copies']:,} copies in {r['wall_s']} s (HTTP up at {r['http_up_s']} s); "
        f"RSS {r['rss_bytes'] / 1e6:,.0f} MB holding it ({r['rss_settled_bytes'] / 1e6:,.0f} MB {SETTLE_S:g} s later), "
        f"peak {r['peak_rss_bytes'] / 1e6:,.0f} MB; "
        f"stream {r['messages']:,} messages, {r['stream_bytes'] / 1e6:,.0f} MB"
    )


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=1024)
    ap.add_argument("--copies", default="10M", help="block copies, e.g. 1M, 10M")
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--pages", type=int, default=512)
    ap.add_argument("--via", default="log,bridge", help="comma-separated: log, bridge (how the stream is filled)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--write-log", default=None, metavar="PATH", help="only write the point's record log; exit")
    return ap.parse_args()


def _write_point(args: argparse.Namespace, path: str) -> None:
    """The point's batches, as bench_peer.py builds them, written as a record log."""
    import random

    from bench_consumers import build_docs, shared_batches
    from bench_peer import write_log

    rnd = random.Random(0)
    docs = build_docs(args.docs, args.pages, rnd)
    batches, _ = shared_batches(docs, args.workers, _parse_copies(args.copies), rnd)
    write_log(path, batches)


def main() -> None:
    from peer_scale import cold_start

    args = _args()
    if args.write_log:
        return _write_point(args, args.write_log)
    out: dict = {"workers": args.workers, "copies": args.copies, "load_avg": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "point.kvlog")
        # in a child: this process stays small, so the children's peak RSS (wait4 counts the forked image) is theirs
        point = ["--workers", str(args.workers), "--copies", args.copies, "--docs", str(args.docs)]
        subprocess.run([sys.executable, __file__, *point, "--pages", str(args.pages), "--write-log", log], check=True)
        out["cold_start"] = cold_start(log)
        for via in args.via.split(","):
            out[f"cold_start_nats_{via}"] = cold_start_nats(log, via, out["cold_start"]["copies"])
    out["load_avg_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{args.workers} workers x {args.copies} copies (load average {out['load_avg'][0]:.2f})")
    for key, r in out.items():
        if key.startswith("cold_start"):
            _print(key, r)


if __name__ == "__main__":
    main()
