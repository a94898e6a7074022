"""Issue 15, a newcomer's first run: one clear line for bad input (exit 2), `tail` says what it
connects to and exits 1 on nothing, its notices explain themselves, the golden table shows every
name. Subprocesses on loopback, ephemeral ports read back from `serve`'s first line."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kvevents.events import KVEventBatch, encode_batch
from kvevents.recordlog import RecordWriter
from kvevents.testing.zeromq import stored

CMD = [sys.executable, "-m", "kvevents"]


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([*CMD, *args], capture_output=True, text=True, timeout=timeout)


def _one_line_usage_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["serve", "--metrics-port", "-1", "--duration", "1"], "--metrics-port must be in 0..65535"),
        (["serve", "--metrics-port", "70000", "--duration", "1"], "--metrics-port must be in 0..65535"),
        (["serve", "--endpoint", "tcp://nohost:1", "--duration", "1"], "host cannot be resolved"),
        (["tail", "tcp://127.0.0.1:5999", "--stale-after", "-1"], "--stale-after must be > 0"),
        (["tail", "tcp://127.0.0.1:5999", "--stale-after", "0"], "--stale-after must be > 0"),
        (["hash", "-1", "5", "-p", "2"], "token id -1 at position 0 is not an integer in 0..4294967295"),
        (["hash", "1", "2", "-7", "-p", "2"], "token id -7 at position 2"),
        (["hash", "1", "2", "--pagesize", "2", "-p", "2"], "no such option: --pagesize"),
    ],
)
def test_bad_input_is_one_clear_line_exit_2(args, words):
    err = _one_line_usage_error(_run(*args))
    assert words in err and "pydantic" not in err and "No such device" not in err


def test_replay_to_an_unresolvable_host_says_so(tmp_path):
    log = tmp_path / "one.kvlog"
    with RecordWriter(log) as w:
        w.write(encode_batch(KVEventBatch(1.0, [stored(1)], 0)), source="w", seq=0, epoch=1, recv_time=1.0)
    err = _one_line_usage_error(_run("replay", str(log), "--to", "tcp://nohost:1"))
    assert "'tcp://nohost:1'" in err and "host cannot be resolved" in err and "None" not in err


def test_golden_table_shows_null_namespace_names():
    r = _run("golden")
    assert r.returncode == 0, r.stderr
    assert "[null, null]" in r.stdout and '[null, "tenant-a"]' in r.stdout


def test_tail_on_nothing_says_connecting_hints_doctor_and_exits_1():
    t0 = time.monotonic()
    r = _run("tail", "tcp://127.0.0.1:1", "--duration", "3.5")
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert lines[0].startswith("kvevents tail: connecting to tcp://127.0.0.1:1")
    assert any("kvevents doctor tcp://127.0.0.1:1" in ln for ln in lines[1:-1])  # the hint after 3 s
    assert lines[-1].startswith("kvevents: check failed: tail: nothing received")
    assert time.monotonic() - t0 < 25


def _serve(*extra: str) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen(
        [*CMD, "serve", "--endpoint", "tcp://127.0.0.1:0", "--replay-endpoint", "tcp://127.0.0.1:0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().split()
    assert first[:2] == ["kvevents", "serve:"], first
    return proc, first[first.index("live") + 1], first[first.index("replay") + 1]


def test_tail_joining_mid_stream_explains_the_loss_and_says_stale_once():
    proc, live, _ = _serve("--rate", "100", "--duration", "2.5", "--heartbeat", "0.1")
    try:
        time.sleep(0.5)  # the stream is running when tail joins (what is being tested, not a sync)
        r = _run("tail", live, "--duration", "5", "--stale-after", "1")
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 0, r.stderr
    assert any(ln.startswith("seq=") for ln in r.stdout.splitlines())
    assert "!" not in r.stdout  # notices on stderr only (no --json)
    loss = [ln for ln in r.stderr.splitlines() if ln.startswith("! losses")]
    assert loss == ["! losses (total 1): joined mid-stream without --replay: earlier batches not seen"], r.stderr
    stale = (r.stdout + r.stderr).count("publisher stale")
    assert stale == 1, r.stderr


def test_tail_json_keeps_notices_on_stdout_as_json():
    import json

    proc, live, replay = _serve("--rate", "50", "--duration", "2", "--heartbeat", "0.1")
    try:
        r = _run("tail", live, "--replay", replay, "--json", "--count", "3", "--duration", "8")
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 0, r.stderr
    objs = [json.loads(ln) for ln in r.stdout.splitlines()]
    notices = [o for o in objs if o["type"] == "notice"]
    assert notices and all("detail" in o for o in notices if o["what"] != "stale")
    assert r.stderr.startswith("kvevents tail: connecting to ")


@pytest.mark.parametrize(
    "command, options",
    [
        (["serve"], ["--engine", "--hash-algo", "--metrics-port"]),
        (["route"], ["--key-mode"]),
        (["hash"], ["--profile"]),
        (["log", "inspect"], ["--profile"]),
        (["demo"], ["--fleet", "--requests", "--duration", "--seed"]),
        (["tail"], ["--count", "--duration"]),
    ],
)
def test_readme_command_rows_name_options_the_cli_has(command, options):
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    row = next(ln for ln in readme.splitlines() if ln.startswith(f"| `kvevents {' '.join(command)} "))
    helptext = _run(*command, "--help").stdout
    for opt in options:
        assert opt in row, (command, opt)
        assert opt in helptext, (command, opt)
