"""`kvevents tail` as a newcomer meets it (issue 15): it says what it connects to and exits 1 on
nothing, its notices explain themselves. Subprocesses on loopback, ephemeral ports read back from
`serve`'s first line; `tail` itself in-process through the real entry point."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.helpers.cli import invoke, spawn


@pytest.mark.slow
def test_tail_on_nothing_says_connecting_hints_doctor_and_exits_1():
    t0 = time.monotonic()
    r = invoke("tail", "tcp://127.0.0.1:1", "--duration", "3.5")
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert lines[0].startswith("kvevents tail: connecting to tcp://127.0.0.1:1")
    assert any("kvevents doctor tcp://127.0.0.1:1" in ln for ln in lines[1:-1])  # the hint after 3 s
    assert lines[-1].startswith("kvevents: check failed: tail: nothing received")
    assert time.monotonic() - t0 < 25


def _serve(*extra: str) -> tuple[subprocess.Popen, str, str]:
    proc = spawn("serve", "--endpoint", "tcp://127.0.0.1:0", "--replay-endpoint", "tcp://127.0.0.1:0", *extra)
    assert proc.stdout is not None
    first = proc.stdout.readline().split()
    assert first[:2] == ["kvevents", "serve:"], first
    return proc, first[first.index("live") + 1], first[first.index("replay") + 1]


@pytest.mark.subprocess
def test_tail_joining_mid_stream_explains_the_loss_and_says_stale_once():
    proc, live, _ = _serve("--rate", "100", "--duration", "30", "--heartbeat", "0.1")
    tail = None
    try:  # tail joins a running stream (a tail starts in >0.3 s: 30 batches went by), which then stops
        tail = spawn("tail", live, "--duration", "3", "--stale-after", "1")
        assert tail.stdout is not None
        first = tail.stdout.readline()
        assert first.startswith("seq="), first
        proc.kill()  # silence from now on: stale once, after 1 s
        rest, err = tail.communicate(timeout=30)
    finally:
        for p in (proc, tail):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.communicate()
    assert tail.returncode == 0, err
    out = first + rest
    assert "!" not in out  # notices on stderr only (no --json)
    loss = [ln for ln in err.splitlines() if ln.startswith("! losses")]
    assert loss == ["! losses (total 1): joined mid-stream without --replay: earlier batches not seen"], err
    stale = (out + err).count("publisher stale")
    assert stale == 1, err


@pytest.mark.subprocess
def test_tail_json_keeps_notices_on_stdout_as_json():
    proc, live, replay = _serve("--rate", "50", "--duration", "2", "--heartbeat", "0.1")
    try:
        r = invoke("tail", live, "--replay", replay, "--json", "--count", "3", "--duration", "8")
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 0, r.stderr
    objs = [json.loads(ln) for ln in r.stdout.splitlines()]
    notices = [o for o in objs if o["type"] == "notice"]
    assert notices and all("detail" in o for o in notices if o["what"] != "stale")
    assert r.stderr.startswith("kvevents tail: connecting to ")
