"""A live `kvevents route` fed by a real `kvevents serve` for the status page, dashboard and browser tests.

`kvevents serve` runs in a subprocess (two simulated workers, dp ranks 0 and 1, ephemeral ports,
publisher metrics on a free port); the router runs in-process (RouterService on port 0, its
subscriber's metrics on a free port). Requests to POST /score come from the serve workload's shape.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from kvevents.consumers.service.core import RouterService
from kvevents.sim.worker import Workload
from kvevents.zeromq.subscriber import Source
from tests.helpers.cli import spawn
from tests.helpers.wait import wait_until


def as_number(text: str) -> float | None:
    """A number cell of the status page ("1,234", or "–"/"" for none)."""
    text = text.strip()
    return None if text in ("", "–") else float(text.replace(",", ""))


class LiveRoute:
    """`kvevents serve --workers 2` in a subprocess + a RouterService serving HTTP (a context manager)."""

    def __init__(
        self, *, workers: int = 2, rate: float = 40.0, duration: float = 120.0, extra: Sequence[Source] = ()
    ) -> None:
        self.proc = spawn(
            "serve",
            "--endpoint",
            "tcp://127.0.0.1:*",
            "--replay-endpoint",
            "tcp://127.0.0.1:*",
            "--workers",
            str(workers),
            "--rate",
            str(rate),
            "--duration",
            str(duration),
            "--heartbeat",
            "0.2",
            "--metrics-port",
            "0",
            "--seed",
            "3",
        )
        self.sources: list[Source] = []
        self.publisher_metrics_port = 0
        try:
            self._read_banner(workers)
            self.service = RouterService(
                self.sources + list(extra), page_size=16, seed=0, stale_after_s=3.0, metrics_port=0
            )
            self.service.start()
            self.host, self.port = self.service.serve_http("127.0.0.1", 0)
        except BaseException:
            self.proc.kill()
            self.proc.wait(5)
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
            raise

    def _read_banner(self, workers: int) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 20
        while len(self.sources) < workers and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("kvevents serve: worker"):
                parts = line.split()
                name = parts[parts.index("worker") + 1]
                live, replay = parts[parts.index("live") + 1], parts[parts.index("replay") + 1]
                self.sources.append(Source(live, replay, name))
                if "metrics" in parts:
                    url = parts[parts.index("metrics") + 1]
                    self.publisher_metrics_port = int(url.rsplit(":", 1)[1].split("/")[0])
        if len(self.sources) < workers:
            raise AssertionError(f"kvevents serve did not start: {self.proc.stderr.read() if self.proc.stderr else ''}")

    def __enter__(self) -> LiveRoute:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.service.stop()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    # ---------------------------------------------------------------- HTTP

    def get(self, path: str, port: int | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, port or self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get_json(self, path: str) -> Any:
        status, _, body = self.get(path)
        assert status == 200, body
        return json.loads(body)

    def score_requests(self, n: int, seed: int = 3) -> None:
        """POST /score for the first n requests of the serve workload (its prompts: many have a prefix)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            for req in Workload(seed=seed, page_size=16).take(n):
                body = json.dumps(
                    {"tokens": req.tokens, "cache_salt": req.namespace.cache_salt, "lora_name": req.lora_name}
                ).encode()
                conn.request("POST", "/score", body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200
        finally:
            conn.close()

    def wait_ready(self) -> None:
        """Until every serve worker has blocks in the index."""

        def ready() -> bool:
            names = {s.name for s in self.sources}
            ws = [w for w in self.get_json("/workers")["workers"] if w["worker"] in names]
            return len(ws) == len(self.sources) and all(w["blocks"] > 0 for w in ws)

        wait_until("route to hold blocks of every worker", ready)
