"""`kvevents route`'s cost and load options (issue 26): a bad one is one line on stderr and exit 2;
good ones reach the service (its /score says the policy)."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.cli import invoke

PUB = "w0=tcp://127.0.0.1:5999"


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--policy", "fastest"), "--policy must be one of cost, prefix"),
        (("--prefill-load-scale", "-1"), "--prefill-load-scale must be a number"),
        (("--temperature", "1e9"), "--temperature must be a number"),
        (("--load-stale-after", "0"), "--load-stale-after must be > 0"),
        (("--predicted-ttl", "-2"), "--predicted-ttl must be 0..3600"),
        (("--metrics-url", "w0"), "expected NAME=URL"),
        (("--metrics-url", "w0=ftp://h/metrics"), "must be http:// or https://"),
        (("--metrics-url", "w9=http://127.0.0.1:1/metrics"), "no --publisher of that name"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(args: tuple[str, ...], needle: str) -> None:
    # in process: the option is refused before anything starts (the watchdog stops a route that serves)
    proc = invoke("route", "--publisher", PUB, "--http", "127.0.0.1:0", *args, env={"COLUMNS": "200"}, timeout=30)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.subprocess
def test_the_options_reach_the_answer() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "kvevents", "route", "--publisher", PUB, "--http", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*cmd, "--policy", "prefix", "--metrics-url", "w0=http://127.0.0.1:1/metrics", "--predicted-ttl", "0"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+) ", banner)
        assert m, banner
        assert proc.stderr.readline().startswith("kvevents route: / status page")
        said = proc.stderr.readline()  # the scraper's one line: nothing listens on port 1
        assert said.startswith("kvevents route: w0: load metrics at http://127.0.0.1:1/metrics unreadable"), said
        conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=10)
        conn.request("POST", "/score", json.dumps({"tokens": list(range(32))}), {"Content-Type": "application/json"})
        out = json.loads(conn.getresponse().read())
        conn.close()
        assert out["policy"] == "prefix" and out["workers_total"] == 0 and out["pick"] is None
    finally:
        proc.terminate()
        proc.wait(10)
