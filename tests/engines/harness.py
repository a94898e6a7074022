"""What the engine drivers share (they run inside an engine's venv, beside the engine's own code).

A kvevents consumer driven in poll mode (Subscriber + BlockIndex, every delivery and reset kept),
a lossy link that forces a gap on a live stream, `kvevents record` as a subprocess, and the report
of named checks the pytest side reads (one JSON object on the driver's last stdout line).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import zmq

from kvevents.consumers.indexer import BlockIndex
from kvevents.recordlog.reader import read_records
from kvevents.zeromq.subscriber import Delivery, Reset, Source, Subscriber
from kvevents.zeromq.wire import unpack_seq


class Report:
    """Named checks (ok + detail), the stand-ins used, and figures; printed as one JSON line."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.checks: dict[str, dict[str, Any]] = {}
        self.standins: list[str] = []
        self.figures: dict[str, float] = {}
        self.t0 = time.monotonic()

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        prev = self.checks.get(name)
        if prev is not None and not prev["ok"]:
            return bool(ok)  # the first failure of a check is the one reported
        self.checks[name] = {"ok": bool(ok), "detail": str(detail)[:2000]}
        return bool(ok)

    @contextmanager
    def guard(self, name: str) -> Iterator[None]:
        """Run a block; an exception fails check `name` with its traceback (the driver goes on)."""
        try:
            yield
        except Exception:  # noqa: BLE001 - reported to the test, which fails on it
            self.check(name, False, traceback.format_exc(limit=6))

    def emit(self) -> None:
        self.figures["driver_s"] = round(time.monotonic() - self.t0, 2)
        out = {"engine": self.engine, "checks": self.checks, "standins": self.standins, "figures": self.figures}
        sys.stdout.write("\nKVEVENTS-REPORT " + json.dumps(out) + "\n")
        sys.stdout.flush()


def diff_counts(want: Counter[int], got: Counter[int]) -> str:
    """'' when equal, else a short description of what differs."""
    if want == got:
        return ""
    missing = want - got
    extra = got - want
    return f"engine {sum(want.values())} copies, index {sum(got.values())}; missing {dict(list(missing.items())[:3])} extra {dict(list(extra.items())[:3])}"


class Consumer:
    """A kvevents Subscriber for one publisher, applying to a BlockIndex in the caller's thread.

    `deliveries` keeps (generation, seq, kind) of every batch; the generation goes up at every
    Reset, so "each batch once, in order" is checked per publisher lifetime.
    """

    def __init__(
        self, source: str, endpoint: str, replay: str | None, *, start: str = "oldest", curve: Any = None
    ) -> None:
        self.source = source
        self.sub = Subscriber(
            [Source(endpoint, replay, name=source, start=start, curve=curve)], request_timeout_s=1.0, stale_after_s=30.0
        )
        self.index = BlockIndex()
        self.generation = 0
        self.deliveries: list[tuple[int, int, str]] = []
        self.resets: list[Reset] = []
        self.broken = ""  # set once a wait timed out: later waits return at once

    def pump(self, timeout_s: float = 0.0) -> None:
        for out in self.sub.poll(timeout_s):
            if isinstance(out, Delivery):
                self.index.apply(out.source, out.batch)
                self.deliveries.append((self.generation, out.seq, out.kind))
            else:
                self.generation += 1
                self.resets.append(out)
                self.index.drop_source(out.source, out.dp_rank if isinstance(out.dp_rank, int) else 0)

    def last_seq(self) -> int:
        mine = [s for g, s, k in self.deliveries if g == self.generation and k != "snapshot"]
        return max(mine) if mine else -1

    def wait_seq(self, seq: int, timeout_s: float = 6.0, *, generation: int | None = None) -> bool:
        """Pump until a batch with `seq` (or later) of the current generation arrived."""
        if self.broken:
            return False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (generation is None or self.generation >= generation) and self.last_seq() >= seq:
                return True
            self.pump(0.02)
        self.broken = f"no batch {seq} within {timeout_s}s; counters {self.sub.counters()}"
        return False

    def settle(self, seconds: float) -> None:
        """Pump for a while (a SUB's connection is not observable from the publisher's side)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.pump(0.02)

    def seqs(self, generation: int) -> list[int]:
        return [s for g, s, k in self.deliveries if g == generation and k != "snapshot"]

    def lifetimes(self, newest: list[int]) -> str:
        """'' when each publisher lifetime i (generations in order) got every batch 0..newest[i] once,
        in order, or (after a resync by snapshot at seq S) every batch S+1..newest[i]."""
        gens = sorted({g for g, _, _ in self.deliveries})
        if len(gens) != len(newest):
            return f"{len(gens)} lifetimes delivered, {len(newest)} published"
        why = []
        for g, n in zip(gens, newest):
            snaps = [s for gg, s, k in self.deliveries if gg == g and k == "snapshot"]
            start = max(snaps) + 1 if snaps else 0
            seqs = self.seqs(g)
            if seqs != list(range(start, n + 1)):
                why.append(f"lifetime {g} from {start}: " + once_in_order([s - start for s in seqs], n + 1 - start))
        return "; ".join(why)

    def close(self) -> None:
        self.sub.stop()


def once_in_order(seqs: list[int], n: int) -> str:
    """'' when `seqs` is exactly 0..n-1, else what is wrong."""
    if seqs == list(range(n)):
        return ""
    dups = [s for s, c in Counter(seqs).items() if c > 1]
    missing = sorted(set(range(n)) - set(seqs))
    return f"{len(seqs)} delivered for {n}; duplicates {dups[:5]} missing {missing[:5]} first {seqs[:8]}"


class LossyLink:
    """Forwards a publisher's live stream (SUB -> PUB, frames unchanged) but drops chosen seqs:
    a consumer behind it sees a real gap and must repair it from the publisher's replay ROUTER."""

    def __init__(self, upstream: str, downstream: str, drop: set[int]) -> None:
        self.drop = set(drop)
        self.dropped = 0
        self.forwarded = 0
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RECONNECT_IVL, 50)
        self._sub.connect(upstream)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(downstream)
        self.endpoint = downstream
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lossy-link", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sub.poll(20):
                continue
            frames = self._sub.recv_multipart()
            if len(frames) == 3 and len(frames[1]) == 8 and unpack_seq(frames[1]) in self.drop:
                self.dropped += 1
                continue
            self.forwarded += 1
            self._pub.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._sub.close(0)
        self._pub.close(0)
        self._ctx.term()


class Recording:
    """`kvevents record` in a subprocess (the venv's interpreter), stopped by --count."""

    def __init__(self, name: str, endpoint: str, replay: str | None, path: str, count: int) -> None:
        spec = f"{name}={endpoint}" + (f",{replay}" if replay else "")
        cmd = [
            sys.executable,
            "-m",
            "kvevents",
            "record",
            "--publisher",
            spec,
            "-o",
            path,
            "--from",
            "oldest",
            "--force",
        ]
        cmd += ["--count", str(count)]
        self.path = path
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
        )

    def finish(self, timeout_s: float = 20.0) -> tuple[int | None, str]:
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            return None, err
        return self.proc.returncode, err

    def batch_seqs(self) -> list[tuple[str, int | None]]:
        """(kind, seq) of every record written so far (a torn tail of a log being written is skipped)."""
        if not os.path.exists(self.path):
            return []
        return [(r.kind, r.seq) for r in read_records(self.path, on_damage=lambda d: None)]


class Route:
    """`kvevents route` in a subprocess on a free HTTP port (read back from its banner)."""

    def __init__(self, name: str, endpoint: str, replay: str | None, page_size: int) -> None:
        spec = f"{name}={endpoint}" + (f",{replay}" if replay else "")
        cmd = [sys.executable, "-m", "kvevents", "route", "--publisher", spec, "--http", "127.0.0.1:0"]
        cmd += ["--page-size", str(page_size), "--seed", "0"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = 0
        self.banner = ""
        assert self.proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline and not self.port and self.proc.poll() is None:
            if sel.select(0.2):
                line = self.proc.stderr.readline()
                self.banner += line
                m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
        sel.close()
        if not self.port:
            self.close()
            raise RuntimeError(f"kvevents route did not start: {self.banner[-500:]}")

    def request(self, method: str, path: str, body: Any = None) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return json.loads(resp.read() or b"null")
        finally:
            conn.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def wait_for(cond: Callable[[], bool], timeout_s: float, step: Callable[[], None] | None = None) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        if step is not None:
            step()
        else:
            time.sleep(0.02)
    return cond()
