"""Real servers for the proxy's tests: scripted OpenAI-like workers on 127.0.0.1 (port 0), and a
RouterService fed by real publishers whose index the tests fill with the blocks they choose."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kvevents.consumers.service.core import RouterService
from kvevents.consumers.service.proxy import Proxy, ProxyConfig
from kvevents.consumers.service.proxy_targets import WorkerUrl
from kvevents.events import BlockStored
from kvevents.hashing import event_hashes_int64
from kvevents.zeromq.publisher import Publisher
from kvevents.zeromq.source import Source

PAGE = 4

Script = Callable[["Handler", dict[str, Any]], None]


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def head_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            return self.json(200, {"object": "list", "data": self.server.owner.models})
        self.json(404, {"error": "no route"})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        owner = self.server.owner
        with owner.lock:
            owner.requests.append(
                {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": raw}
            )
        owner.script(self, json.loads(raw))


class _Server(ThreadingHTTPServer):
    owner: Upstream


def answer_ok(h: Handler, body: dict[str, Any]) -> None:
    """A completion answered at once, naming the worker."""
    h.json(200, {"object": "text_completion", "choices": [], "system_fingerprint": h.server.owner.name})


class Upstream:
    """A scripted worker: `script(handler, body)` answers each POST; every request is recorded."""

    def __init__(self, name: str, script: Script = answer_ok, models: Sequence[dict] | None = None) -> None:
        self.name = name
        self.script = script
        self.models = list(models or [{"id": "base-model", "object": "model"}])
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # poll 0.02 s: shutdown() waits out one poll (0.5 s by default)
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)


def dead_url() -> str:
    """A loopback URL nothing listens on (a port bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


class Rig:
    """Publishers named `names` (dp rank 0 each), a RouterService over them serving HTTP on port 0,
    and a Proxy sending to `urls` (name -> URL)."""

    def __init__(
        self,
        names: Sequence[str],
        urls: dict[str, str],
        *,
        renderer: Any = None,
        security: Any = None,
        config: ProxyConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        routing: Any = None,
    ) -> None:
        self.pubs = {
            n: Publisher(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", heartbeat_interval_s=0.1)
            for n in names
        }
        sources = [Source(p.endpoint, p.replay_endpoint, n) for n, p in self.pubs.items()]
        self.service = RouterService(sources, page_size=PAGE, seed=0, renderer=renderer, routing=routing)
        self.service.start()
        keyed = security is not None and security.keyed
        self.proxy = Proxy(
            self.service,
            [WorkerUrl(n, None, u) for n, u in urls.items()],
            config,
            forward_authorization=not keyed,
            clock=clock,
        )
        try:
            host, port = self.service.serve_http("127.0.0.1", 0, security=security, proxy=self.proxy)
        except BaseException:
            self.close()
            raise
        scheme = "https" if security is not None and security.tls else "http"
        self.base = f"{scheme}://{host}:{port}"
        # every publisher heard before a test sends: a worker the index has not listed yet is costed
        # by the proxy's own in-flight count alone, which would race the tests that route by load
        try:
            wait_for(self._all_listed, what="every worker listed by the router")
        except BaseException:
            self.close()
            raise

    def _all_listed(self) -> bool:
        listed = {w["worker"] for w in self.service.handle_score(b'{"tokens": [], "route": false}')[1]["workers"]}
        return listed >= set(self.pubs)

    def store(self, name: str, tokens: Sequence[int], lora_name: str | None = None) -> None:
        """Publish `tokens`' whole pages as stored on worker `name`, and wait until the router applied them."""
        whole = list(tokens[: len(tokens) // PAGE * PAGE])
        hashes = event_hashes_int64(whole, PAGE, None)
        self.pubs[name].publish([BlockStored(hashes, None, whole, PAGE, None, "GPU", lora_name)])
        # a probe, not a routing decision: it must not credit predicted blocks
        body = json.dumps({"tokens": whole, "lora_name": lora_name, "route": False}).encode()

        def held() -> bool:
            workers = self.service.handle_score(body)[1]["workers"]
            return any(w["worker"] == name and w["matched_pages"] == len(whole) // PAGE for w in workers)

        wait_for(held, what=f"{name}'s blocks in the router's index")

    def close(self) -> None:
        self.service.stop()
        for p in self.pubs.values():
            p.close(0)
