"""A simulated fleet in subprocesses: `kvevents serve --workers N --http` (every worker its own
/v1/completions) and a `kvevents route --proxy` in front of it, their addresses read from the lines
they print. Everything on 127.0.0.1 with free ports; `close()` stops both."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Fleet", "KvProc", "ServedWorker"]

CMD = [sys.executable, "-m", "kvevents"]


class KvProc:
    """A kvevents subprocess whose stdout and stderr lines are read on threads (no blocking reads)."""

    def __init__(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.command = str(args[0]) if args else "kvevents"
        self.proc = subprocess.Popen(
            [*CMD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(p,), daemon=True) for p in self._pipes()]
        for t in self._readers:
            t.start()

    def _pipes(self) -> list:
        return [p for p in (self.proc.stdout, self.proc.stderr) if p is not None]

    def _read(self, pipe) -> None:  # type: ignore[no-untyped-def]
        for line in pipe:
            self.lines.put(line)

    def wait_line(self, want: Callable[[str], bool], timeout: float = 30.0) -> str:
        """The next line (stdout or stderr) for which `want` is true; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if want(line):
                return line
        raise AssertionError(f"kvevents {self.command}: no expected line; saw: {''.join(self.seen)[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for t in self._readers:
            t.join(5)
        for p in self._pipes():
            p.close()


@dataclass(frozen=True)
class ServedWorker:
    """One simulated worker as `kvevents serve` printed it."""

    name: str
    dp_rank: int
    live: str
    replay: str
    url: str  # its OpenAI base URL (http://HOST:PORT)


class Fleet:
    """`kvevents serve --workers N --http 127.0.0.1:0` and `kvevents route --proxy` over all its workers.

    `serve_args` go to serve (e.g. --page-size), `route_args` to route (e.g. --policy). The serve
    workload is slowed to almost nothing (one request at start): the traffic is the caller's.
    """

    def __init__(
        self,
        workers: int,
        *,
        serve_args: Sequence[str] = (),
        route_args: Sequence[str] = (),
        route_env: dict[str, str] | None = None,
    ) -> None:
        self.procs: list[KvProc] = []
        try:
            serve = self._start(
                [
                    "serve", "--workers", str(workers), "--endpoint", "tcp://127.0.0.1:*",
                    "--replay-endpoint", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0", "--rate", "0.0001",
                    "--heartbeat", "0.2", *serve_args,
                ]
            )  # fmt: skip
            self.workers = self._read_serve(serve, workers)
            self.route = self._start(
                [
                    "route", *(a for w in self.workers for a in ("--publisher", f"{w.name}={w.live},{w.replay}")),
                    "--http", "127.0.0.1:0", "--proxy",
                    *(a for w in self.workers for a in ("--worker-url", f"{w.name}={w.url}")), *route_args,
                ],
                route_env,
            )  # fmt: skip
            line = self.route.wait_line(lambda s: s.startswith("kvevents route:") and "://127.0.0.1:" in s)
            self.base = "http" + line.split(" http", 1)[1].split()[0]
        except BaseException:
            self.close()
            raise

    def _start(self, args: list[str], env: dict[str, str] | None = None) -> KvProc:
        p = KvProc(args, env)
        self.procs.append(p)
        return p

    @staticmethod
    def _read_serve(serve: KvProc, workers: int) -> list[ServedWorker]:
        pubs: dict[str, tuple[int, str, str]] = {}
        urls: dict[str, str] = {}
        while len(urls) < workers:
            words = serve.wait_line(lambda s: s.startswith("kvevents serve:")).split()
            if words[2] == "worker":  # kvevents serve: worker wI live E replay R (wI is dp rank I)
                live, replay = words[words.index("live") + 1], words[words.index("replay") + 1]
                pubs[words[3]] = (int(words[3][1:]), live, replay)
            elif words[2] == "http":  # kvevents serve: http URL/v1/completions (worker wI; ...)
                urls[words[5].rstrip(";")] = words[3].rsplit("/v1/", 1)[0]
        return [ServedWorker(n, *pubs[n], url=urls[n]) for n in sorted(pubs, key=lambda n: pubs[n][0])]

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
