"""Silent misconfigurations named on the line a user reads: `route --page-size 32` against 16-token
publishers, live and replay swapped, a live port given as the replay endpoint, CURVE mismatches
(kvevents.published, kvevents.zeromq.handshake), in route, tail, record and doctor."""

from __future__ import annotations

import http.client
import json
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvevents.zeromq.security import generate_keypair
from tests.helpers.cli import invoke, spawn
from tests.helpers.live_publisher import LivePublisher
from tests.helpers.wait import wait_until


@pytest.fixture(scope="module")
def pub() -> Iterator[LivePublisher]:
    with LivePublisher("contract", page=16) as p:
        yield p


def _workers(port: int) -> list[dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/workers")
        return json.loads(conn.getresponse().read())["workers"]
    finally:
        conn.close()


@pytest.mark.subprocess
def test_route_says_its_page_size_is_not_the_publishers_and_exits_130_on_ctrl_c(pub: LivePublisher) -> None:
    proc = spawn(
        "route", "--publisher", f"w0={pub.endpoint},{pub.replay}", "--page-size", "32", "--http", "127.0.0.1:0"
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_until("the mismatch line", lambda: any("--page-size is 32" in ln for ln in lines), timeout=20)
        line = next(ln for ln in lines if "--page-size is 32" in ln)
        assert line.strip() == (
            "kvevents route: w0: publishes 16-token pages but --page-size is 32: none of its blocks can be "
            "indexed or matched (give --page-size 16)"
        )
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", lines[0]).group(1))  # type: ignore[union-attr]
        (w,) = _workers(port)
        assert (
            w["blocks"] == 0
            and w["published"]["page_size"] == 16
            and "give --page-size 16" in w["published"]["mismatch"]
        )
        assert w["published"]["hash_chain"] == "contract" and w["problem"] is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        reader.join(5)
        proc.stdout.close()  # type: ignore[union-attr]
    assert any(ln.startswith("kvevents route: stopped after") for ln in lines), lines
    assert not any("Traceback" in ln for ln in lines)


def _sockets_check(out: str) -> dict:
    return next(c for c in json.loads(out)["checks"] if c["name"] == "sockets and keys")


def test_doctor_names_live_and_replay_swapped(pub: LivePublisher) -> None:
    r = invoke("doctor", pub.replay, "--replay", pub.endpoint, "--timeout", "0.5", "--json")  # every check fails
    assert r.returncode == 1
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert checks["sockets and keys"]["status"] == "fail"
    assert "the live and replay endpoints are swapped" in checks["sockets and keys"]["hint"]
    assert checks["batches arrive and decode"]["hint"].startswith(
        "likely cause: the live and replay endpoints are swapped"
    )


def test_doctor_names_a_live_port_given_as_the_replay_endpoint(pub: LivePublisher) -> None:
    r = invoke("doctor", pub.endpoint, "--replay", pub.endpoint, "--timeout", "1", "--json")
    assert r.returncode == 1
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert f"replay endpoint {pub.endpoint} is not a ROUTER socket" in checks["sockets and keys"]["hint"]
    assert checks["replay answers"]["hint"].startswith(f"likely cause: replay endpoint {pub.endpoint} is not a ROUTER")


def test_doctor_names_a_curve_key_that_is_not_the_publishers(tmp_path: Path) -> None:
    server, server_secret = generate_keypair(tmp_path, "server")
    other, _ = generate_keypair(tmp_path, "other")
    with LivePublisher("contract", page=16, curve_secret_key_file=str(server_secret)) as p:
        r = invoke("doctor", p.endpoint, "--curve-server-key", str(other), "--timeout", "1", "--json")
        assert r.returncode == 1
        assert "--curve-server-key is not this publisher's public key" in _sockets_check(r.stdout)["hint"]
        r = invoke("doctor", p.endpoint, "--timeout", "1", "--json")  # no key at all
        assert r.returncode == 1 and f"{p.endpoint} requires CURVE" in _sockets_check(r.stdout)["hint"]
        r = invoke("doctor", p.endpoint, "--curve-server-key", str(server), "--timeout", "1", "--json")
        assert _sockets_check(r.stdout)["status"] == "ok"


@pytest.mark.slow  # the 3 s "nothing received" hint
@pytest.mark.subprocess
def test_tail_and_record_name_swapped_endpoints_instead_of_is_a_publisher_running(
    pub: LivePublisher, tmp_path: Path
) -> None:
    # both at once (each waits out the 3 s hint): one wait instead of two
    tail = spawn("tail", pub.replay, "--replay", pub.endpoint, "--duration", "3.6")
    rec = spawn("record", "--publisher", f"w0={pub.replay},{pub.endpoint}", "-o", str(tmp_path / "w0.kvlog"),
                "--duration", "3.6")  # fmt: skip
    (_, tail_err), (_, rec_err) = tail.communicate(timeout=30), rec.communicate(timeout=30)
    assert tail.returncode == 1 and "Traceback" not in tail_err + rec_err
    hint = next(ln for ln in tail_err.splitlines() if "is not a PUB socket" in ln)
    assert hint.startswith(f"kvevents tail: {pub.replay} accepts connections but is not a PUB socket")
    assert "live and replay swapped" in hint and "is a publisher running" not in tail_err
    assert rec.returncode == 1
    assert f"w0: {pub.replay} accepts connections but is not a PUB socket" in rec_err
    assert "is a publisher running" not in rec_err


@pytest.mark.slow  # the replay request to a PUB times out
@pytest.mark.subprocess
def test_tail_names_a_live_port_given_as_the_replay_endpoint(pub: LivePublisher) -> None:
    tail = spawn("tail", pub.endpoint, "--replay", pub.endpoint, "--duration", "20")
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(tail.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:  # stopped once the notice came: the duration is only a bound
        wait_until("a replay notice", lambda: any(ln.startswith("! ") for ln in err), timeout=20)
    finally:
        tail.send_signal(signal.SIGINT)
        tail.communicate(timeout=10)
        reader.join(5)
    notices = [ln for ln in err if ln.startswith("! ")]
    assert all(f"replay endpoint {pub.endpoint} is not a ROUTER socket" in ln for ln in notices), notices
    assert "no longer holds" not in "".join(err) and "Traceback" not in "".join(err)


@pytest.mark.subprocess
def test_record_prints_its_summary_then_exits_130_on_ctrl_c(pub: LivePublisher, tmp_path: Path) -> None:
    proc = spawn("record", "--publisher", f"w0={pub.endpoint},{pub.replay}", "-o", str(tmp_path / "w0.kvlog"))
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("recording 1 source(s)")
        line = "kvevents record: w0: publishes 16-token pages, contract hashes, replay framing 4-frame\n"
        wait_until("the line saying what w0 publishes", lambda: line in err)
        proc.send_signal(signal.SIGINT)
        out = proc.stdout.read()
        assert proc.wait(20) == 130, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        reader.join(5)
    assert out.startswith("recorded ") and out.splitlines()[0].endswith("(interrupted)"), out
    assert not any("Traceback" in ln for ln in err)


def test_relay_says_what_the_engine_publishes(pub: LivePublisher) -> None:
    r = invoke(
        "relay", "--from", f"e0={pub.endpoint},{pub.replay}", "--endpoint", "tcp://127.0.0.1:*", "--duration", "1.5"
    )
    assert r.returncode == 0, r.stderr
    assert (
        "kvevents relay: e0: publishes 16-token pages, contract hashes, replay framing 4-frame" in r.stdout.splitlines()
    )
