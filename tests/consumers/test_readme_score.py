"""The README's /score example hits: `serve` and `route` as it starts them, then a request made
from what `serve` publishes (`kvevents tail --json` through kvevents.consumers.score_request into
curl) answers with a best worker. Ports are moved off the defaults; the commands are the README's."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading

import pytest

from kvevents.consumers.score_request import score_body
from tests.helpers.marks import require
from tests.helpers.repo import README
from tests.helpers.wait import wait_until


def _example() -> str:
    section = README.read_text().split("## The router's HTTP API", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def _free_run(n: int) -> int:
    """A base port with n free ports from it."""
    for _ in range(200):
        base = random.randrange(20000, 60000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


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


@pytest.mark.subprocess
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_the_readme_score_example_finds_a_worker() -> None:
    require("subprocess")
    base, http = _free_run(4), _free_run(1)
    script = _example()
    assert (
        "kvevents tail tcp://127.0.0.1:5557 --json --count 20 | python3 -m kvevents.consumers.score_request" in script
    )
    script = script.replace(
        "kvevents serve --workers 2", f"kvevents serve --workers 2 --endpoint tcp://127.0.0.1:{base}"
    )
    for i, port in enumerate((5557, 5558, 5559, 5560)):
        script = script.replace(f"127.0.0.1:{port}", f"127.0.0.1:{base + i}")
    script = script.replace("127.0.0.1:8080", f"127.0.0.1:{http}").replace("python3 ", f"{sys.executable} ")
    # a loaded machine may take longer than the README's 2 s to start both: wait for the router
    script = script.replace(
        "sleep 2", f"until curl -sf http://127.0.0.1:{http}/healthz >/dev/null; do sleep 0.2; done; sleep 1"
    )
    head = f'kvevents() {{ "{sys.executable}" -m kvevents "$@"; }}\n'
    proc = subprocess.Popen(
        ["bash", "-c", head + script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until("the /score answer", lambda: any(ln.startswith('{"pages"') for ln in out), timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # serve and route, left running by the example's `&`
        proc.wait(10)
        err = proc.stderr.read()  # type: ignore[union-attr]
        reader.join(5)
    answer = json.loads(next(ln for ln in out if ln.startswith('{"pages"')))
    assert answer["best"] == "w0" and answer["workers"][0]["matched_pages"] >= 1, (answer, err[-2000:])
    assert "Traceback" not in err
