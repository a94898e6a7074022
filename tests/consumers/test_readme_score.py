"""The README's /score example hits: `serve` and `route` as it starts them, then a request made
from what `serve` publishes (`kvevents tail --json` through kvevents.consumers.score_request into
curl) answers with a best worker. Ports are moved off the defaults; the commands are the README's."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from kvevents.consumers.score_request import score_body
from tests.helpers.cli import spawn
from tests.helpers.marks import require
from tests.helpers.repo import README


def _example() -> str:
    section = README.read_text().split("## The router's HTTP API", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_score_body_takes_the_newest_chain_head() -> None:
    lines = [
        '{"type":"notice","what":"losses"}',
        json.dumps(
            {
                "type": "batch",
                "events": [{"type": "BlockStored", "parent_block_hash": None, "token_ids": [1, 2], "cache_salt": "t"}],
            }
        ),
        json.dumps({"type": "batch", "events": [{"type": "BlockStored", "parent_block_hash": 5, "token_ids": [3, 4]}]}),
        json.dumps({"type": "heartbeat", "seq": 3}),
        "not json",
    ]
    assert score_body(lines) == {"tokens": [1, 2], "cache_salt": "t", "lora_name": None}
    assert score_body(lines[3:]) is None


def _readline_matching(stream: Any, pattern: str, what: str, timeout: float = 60.0) -> re.Match[str]:
    """The first line of `stream` matching `pattern` (read on a thread, so a silent process fails the test)."""
    found: list[re.Match[str]] = []

    def read() -> None:
        for line in iter(stream.readline, ""):
            m = re.search(pattern, line)
            if m:
                found.append(m)
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout)
    assert found, f"no line saying {what}"
    return found[0]


def _stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_the_readme_score_example_finds_a_worker() -> None:
    """The README's three steps, each as written but on ports the OS picked: `serve` and `route` bind
    `*` / port 0 and say where, and those addresses replace the README's in the next step."""
    require("subprocess")
    lines = _example().replace("\\\n", " ").splitlines()
    serve_line, route_line, _, pipe_line = (ln.split("#", 1)[0].strip().rstrip("&").strip() for ln in lines[:4])
    assert serve_line == "kvevents serve --workers 2" and route_line.startswith("kvevents route --publisher w0=")
    assert pipe_line.startswith("kvevents tail tcp://127.0.0.1:5557 --json --count 20 | python3 -m kvevents.")
    wild = "tcp://127.0.0.1:*"
    serve = spawn(*serve_line.split()[1:], "--endpoint", wild, "--replay-endpoint", wild)
    route = None
    try:
        ports: dict[int, str] = {}
        for rank in (0, 1):
            m = _readline_matching(serve.stdout, r"live (tcp://\S+) replay (tcp://\S+)", f"where w{rank} listens")
            ports[5557 + rank], ports[5559 + rank] = m.group(1), m.group(2)
        for readme_port, endpoint in ports.items():
            route_line = route_line.replace(f"tcp://127.0.0.1:{readme_port}", endpoint)
            pipe_line = pipe_line.replace(f"tcp://127.0.0.1:{readme_port}", endpoint)
        route = spawn(*shlex.split(route_line.replace("127.0.0.1:8080", "127.0.0.1:0"))[1:])
        http = _readline_matching(route.stderr, r"http://(127\.0\.0\.1:\d+)", "where route serves").group(1)
        pipe_line = pipe_line.replace("127.0.0.1:8080", http).replace("python3 ", f"{sys.executable} ")
        head = f'kvevents() {{ "{sys.executable}" -m kvevents "$@"; }}\n'
        r = subprocess.run(["bash", "-c", head + pipe_line], capture_output=True, text=True, timeout=60)
    finally:
        _stop(*(p for p in (route, serve) if p is not None))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    answer = json.loads(r.stdout)
    assert answer["best"] == "w0" and answer["workers"][0]["matched_pages"] >= 1, answer
