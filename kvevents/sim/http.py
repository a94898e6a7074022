"""A minimal OpenAI-compatible `/v1/completions` in front of a simulated worker (`kvevents serve --http`:
one per worker).

Prompts are token-id lists; `model` names a LoRA adapter (the base model name means none) and
`cache_salt` the tenant salt, as vLLM and SGLang take them. Each request is served by the worker
and its events are published before the response is sent, so a client that saw the response can
expect the events. Nothing is generated: the completion text is empty. `stream: true` answers as
an event stream (chunked), as OpenAI's API does, with a usage chunk when `stream_options.include_usage`.
`system_fingerprint` names the worker that answered. Standard library only.
With a `LoadHonestEngine` (kvevents.sim.timing) a request takes time for its uncached prompt
tokens and its `max_tokens`, queues behind `max_running` others, and GET /metrics reports it in
the engine's own metric names (kvevents.sim.metrics).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kvevents.hashing import Namespace
from kvevents.sim import worker as sim
from kvevents.sim.metrics import CONTENT_TYPE, render_metrics
from kvevents.sim.timing import LoadHonestEngine, SimTiming
from kvevents.sim.worker import Request

__all__ = [
    "BASE_MODEL",
    "CompletionsServer",
    "parse_http_address",
    "serve_and_publish",
    "serve_http",
    "worker_addresses",
]

BASE_MODEL = "kvevents-sim"
MAX_BODY = 8 << 20
MAX_DECODE = 1_000_000  # max_tokens accepted


def parse_http_address(spec: str) -> tuple[str, int]:
    """HOST:PORT (port 0: a free one) -> (host, port); ValueError says what is wrong."""
    host, sep, port = spec.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--http must be HOST:PORT (port 0-65535), got {spec!r}")
    return host.strip("[]"), int(port)


def worker_addresses(spec: str, workers: int) -> list[str]:
    """`kvevents serve --http HOST:PORT` for every worker: worker i on PORT + i (port 0: each a free
    one). ValueError when the last port is past 65535."""
    host, port = parse_http_address(spec)
    if port and port + workers - 1 > 65535:
        raise ValueError(
            f"--http {spec!r}: {workers} workers need ports {port}..{port + workers - 1} (worker i: port + i)"
        )
    shown = f"[{host}]" if ":" in host else host
    return [f"{shown}:{port + i if port else 0}" for i in range(workers)]


def serve_and_publish(worker: Any, publisher: Any, request: Request) -> int:
    """Serve one request on a contract or a vLLM simulated worker and publish its events (the
    engine step of `kvevents.sim.worker.serve_and_publish`); returns the prompt tokens already cached."""
    before = worker.device_hit_tokens
    sim.serve_and_publish(worker, request, publisher)
    return int(worker.device_hit_tokens - before)


def _prompts(body: dict[str, Any]) -> list[list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        batch = prompt
    else:
        batch = [prompt]
    for p in batch:
        if not isinstance(p, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            raise ValueError("prompt must be a list of token ids (this simulated engine has no tokenizer)")
    return batch


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests, answered by the CompletionsServer its HTTP server carries."""

    protocol_version = "HTTP/1.1"
    # keep-alive answers went out as two writes (headers, body) with Nagle on: the body waited
    # ~40 ms for the client's delayed ACK (issue 30). Now TCP_NODELAY, and a buffered wfile that
    # handle_one_request flushes once per request: headers and body leave in one write.
    disable_nagle_algorithm = True
    wbufsize = -1

    @property
    def app(self) -> CompletionsServer:
        return self.server.completions  # type: ignore[attr-defined, no-any-return]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, code: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, obj: dict[str, Any], include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in _events(obj, include_usage):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _error(self, code: int, message: str) -> None:
        self._reply(code, {"error": {"message": message, "type": "invalid_request_error", "code": code}})

    def do_GET(self) -> None:
        if self.path == "/metrics" and self.app.engine is not None:
            data = render_metrics(self.app.metrics_names, self.app.engine.load(self.app.base_model)).encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/v1/models":
            self._reply(200, {"object": "list", "data": [{"id": self.app.base_model, "object": "model"}]})
        elif self.path == "/health":
            self._reply(200, {"status": "ok"})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            return self._error(404, f"no route {self.path}")
        try:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_BODY:
                return self._error(413, "request body too large")
            body = json.loads(self.rfile.read(n) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            answer = self.app.complete(body)
            if body.get("stream") is True:
                options = body.get("stream_options")
                return self._stream(answer, isinstance(options, dict) and options.get("include_usage") is True)
            self._reply(200, answer)
        except ValueError as exc:
            self._error(400, str(exc))


class CompletionsServer:
    """Serves /v1/completions, /v1/models and /health on a thread; `close()` stops it and frees the port."""

    def __init__(
        self,
        address: str,
        handle: Callable[[Request], int],
        *,
        lock: threading.Lock | None = None,
        base_model: str = BASE_MODEL,
        name: str = "w0",
        engine: LoadHonestEngine | None = None,
        metrics_names: str = "sglang",
    ) -> None:
        host, port = parse_http_address(address)
        self.base_model = base_model
        self.name = name
        self.engine = engine  # None: every request is served at once (no timing, no /metrics)
        self.metrics_names = metrics_names  # "vllm" or "sglang": whose metric names /metrics uses
        self.requests = 0
        self._handle = handle
        self._lock = lock or threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.completions = self  # type: ignore[attr-defined]  # what _Handler serves
        self._httpd.daemon_threads = True
        self.host, self.port = host, int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="kvevents-http", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """One completions request: serve every prompt (publishing its events), answer as OpenAI does."""
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise ValueError("model must be a string")
        salt = body.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise ValueError("cache_salt must be a string")
        decode = body.get("max_tokens")
        if decode is None:
            decode = 0
        if isinstance(decode, bool) or not isinstance(decode, int) or not 0 <= decode <= MAX_DECODE:
            raise ValueError(f"max_tokens must be an integer 0..{MAX_DECODE}")
        adapter = None if model in (None, "", self.base_model) else model
        prompts = _prompts(body)
        choices, prompt_tokens, cached = [], 0, 0
        for i, tokens in enumerate(prompts):
            cached += self._serve(Request(list(tokens), Namespace(adapter, salt), lora_name=adapter), decode)
            prompt_tokens += len(tokens)
            choices.append({"index": i, "text": "", "logprobs": None, "finish_reason": "length"})
        return {
            "id": f"cmpl-kvevents-{self.requests}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model or self.base_model,
            "system_fingerprint": f"kvevents-sim-{self.name}",
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": decode * len(prompts),
                "total_tokens": prompt_tokens + decode * len(prompts),
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    def _serve(self, req: Request, decode: int) -> int:
        """One prompt: at once, or through the load-honest engine (queued, timed); cached tokens."""

        def step() -> int:
            with self._lock:
                self.requests += 1
                return self._handle(req)

        if self.engine is None:
            return step()
        return self.engine.run(len(req.tokens), decode, step)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(2.0)

    def __enter__(self) -> CompletionsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _events(answer: dict[str, Any], include_usage: bool) -> list[bytes]:
    """A completion as OpenAI streams it: a chunk per choice, the usage chunk if asked, [DONE]."""
    head = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint")}
    chunks = [{**head, "object": "text_completion", "choices": [c]} for c in answer["choices"]]
    if include_usage:
        chunks.append({**head, "object": "text_completion", "choices": [], "usage": answer["usage"]})
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def serve_http(
    address: str,
    worker: Any,
    publisher: Any,
    lock: threading.Lock,
    *,
    timing: SimTiming | None = None,
    engine: str = "contract",
    page_size: int = 16,
    capacity_pages: int = 4096,
    dp_rank: int = 0,
) -> CompletionsServer:
    """`kvevents serve --http`: the endpoint in front of one worker, load-honest with `timing`
    (metrics in vLLM's names for engine "vllm", SGLang's otherwise); the caller's serving loop holds
    `lock` around each of its own steps. ValueError (one line) for a bad or busy address."""
    load = None
    if timing is not None:
        load = LoadHonestEngine(timing, page_size=page_size, capacity_pages=capacity_pages, dp_rank=dp_rank)
    names = "vllm" if engine == "vllm" else "sglang"
    try:
        return CompletionsServer(
            address,
            lambda req: serve_and_publish(worker, publisher, req),
            lock=lock,
            name=str(worker.name),
            engine=load,
            metrics_names=names,
        )
    except OSError as exc:
        raise ValueError(f"--http {address}: {exc}") from None
