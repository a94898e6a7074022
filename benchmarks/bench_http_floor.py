"""The floor of bench_http.py: a bare FastAPI app on uvicorn (its defaults) whose POST /score
decodes the JSON body with msgspec and answers a fixed JSON about the size of route's answer for
4 workers. Serves 127.0.0.1 on a free port, prints {"port": ..., "http": ...}, stops when stdin closes.

(No `from __future__ import annotations` here: FastAPI must see the real `Request` annotation.)
"""

import json
import sys
import threading
import time
from typing import Optional

import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

FIXED = json.dumps(
    {
        "pages": 128,
        "page_size": 16,
        "best": "w0",
        "best_dp_rank": 0,
        "stale": False,
        "workers": [
            {"worker": f"w{i}", "dp_rank": 0, "score": 128.0 - i, "matched_pages": 128 - i}
            | {"matched_tokens": (128 - i) * 16, "load": 0.0, "stale": False}
            for i in range(4)
        ],
    }
).encode()


class Body(msgspec.Struct):
    """The fields of route's /score body."""

    tokens: list[int]
    cache_salt: Optional[str] = None
    lora_name: Optional[str] = None
    top_k: Optional[int] = None
    explain: bool = False


app = FastAPI()
decoder = msgspec.json.Decoder(Body)


@app.post("/score")
async def score(request: Request) -> Response:
    decoder.decode(await request.body())
    return Response(FIXED, media_type="application/json")


def main() -> None:
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", access_log=False, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        sys.exit("the floor server did not start")
    port = server.servers[0].sockets[0].getsockname()[1]
    print(json.dumps({"port": port, "http": config.http_protocol_class.__name__}), flush=True)
    sys.stdin.read()
    server.should_exit = True
    thread.join(5)


if __name__ == "__main__":
    main()
