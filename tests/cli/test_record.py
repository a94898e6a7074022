"""`kvevents record` and `kvevents replay --to` as a newcomer meets them: where a capture starts
(--from), honest results when nothing arrives, bad messages skipped, sizes that agree, a replayer
that binds. Real publishers and sockets on 127.0.0.1, the CLI through its real entry point in
process where the command ends by itself (a capture ends at --count: the engine steps on a
thread meanwhile), as a subprocess where it is signalled or its stdout is read while it runs."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from kvevents.recordlog import Record, RecordWriter, read_records
from tests.helpers.recordlog import payload

pytest.importorskip("kvevents.zeromq.publisher")
from kvevents.cache import RadixCache  # noqa: E402
from kvevents.sim.worker import Workload  # noqa: E402
from kvevents.zeromq.publisher import Publisher  # noqa: E402
from kvevents.zeromq.wire import pack_seq  # noqa: E402
from tests.helpers.cli import argv as _kv
from tests.helpers.cli import invoke
from tests.helpers.repo import README, REPO

PAGE = 4


@pytest.fixture()
def refusing_endpoint() -> Iterator[str]:
    """A 127.0.0.1 port held by a socket that never listens: connections there are refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        yield f"tcp://127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


# ---------------------------------------------------------------- nothing received
@pytest.mark.slow
def test_record_with_nothing_received_says_so_and_exits_1(tmp_path: Path, refusing_endpoint: str) -> None:
    out = tmp_path / "none.kvlog"
    r = invoke("record", "--publisher", f"w0={refusing_endpoint}", "-o", str(out), "--duration", "3.5")
    assert r.returncode == 1, (r.stdout, r.stderr)
    err = r.stderr.splitlines()
    assert err[0] == f"kvevents: connecting to w0 at {refusing_endpoint}"
    assert any("nothing received after 3s" in x and "kvevents doctor" in x for x in err), r.stderr
    assert err[-1].startswith("kvevents: check failed: nothing received in 3.")
    assert f"`kvevents doctor {refusing_endpoint}`" in err[-1]
    # nothing written: no 16-byte header-only file is left for the next run to refuse
    assert not out.exists() and "recorded nothing from 1 source(s)" in r.stdout and "no file left" in r.stdout


# ---------------------------------------------------------------- where a capture starts
def _step(cache: RadixCache, reqs: Iterator, n: int = 1) -> None:
    for _ in range(n):
        req = next(reqs)
        cache.insert(req.tokens, req.namespace)
        if cache.num_pages > 48:
            cache.evict(16)
        cache.flush_events()


def _capture(
    tmp_path: Path, start: str, *, snapshots: bool = True, count: int = 12, buffer_steps: int = 10000
) -> tuple[list[Record], str, str, Path]:
    """40 steps of history, then `record --from START --count N` while the engine keeps going."""
    pub = Publisher(
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        heartbeat_interval_s=0.2,
        snapshots=snapshots,
        buffer_steps=buffer_steps,
    )
    cache = RadixCache(PAGE, capacity_pages=64, on_events=pub.publish)
    reqs = iter(Workload(seed=3, page_size=PAGE).take(5000))
    out = tmp_path / f"{start}.kvlog"
    done = threading.Event()

    def engine() -> None:  # the engine keeps stepping until the recorder has its count
        while not done.is_set():
            _step(cache, reqs)
            time.sleep(0.02)

    stepper = threading.Thread(target=engine, daemon=True)
    try:
        _step(cache, reqs, 40)
        stepper.start()
        spec = f"w0={pub.endpoint},{pub.replay_endpoint}"
        r = invoke("record", "--publisher", spec, "-o", str(out), "--count", str(count), "--duration", "30",
                   "--from", start, timeout=60)  # fmt: skip
    finally:
        done.set()
        stepper.join(10)
        pub.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("recording"), r.stdout
    return list(read_records(out)), r.stdout, r.stderr, out


def _verified(out: Path) -> dict:
    r = invoke("log", "inspect", str(out), "--json", "--verify", "--page-size", str(PAGE))
    assert r.returncode == 0, r.stdout[-2000:]
    j = json.loads(r.stdout)
    assert j["gaps"] == [] and j["verify"]["violations"] == []
    return j


def test_record_from_snapshot_is_the_default_and_verifies(tmp_path: Path) -> None:
    recs, stdout, _, out = _capture(tmp_path, "snapshot")
    assert recs[0].kind == "reset" and recs[0].reason == "first"
    snap = [r for r in recs if r.kind == "snapshot"]
    s = snap[0].seq
    assert s is not None and s >= 39 and {r.seq for r in snap} == {s}
    stream = [r for r in recs if r.kind in ("live", "replay")]
    assert stream and stream[0].seq == s + 1 and [r.seq for r in stream] == list(range(s + 1, s + 1 + len(stream)))
    assert len(stream) == 12 and f"the log holds {len(snap)} snapshot, " in stdout
    j = _verified(out)
    size = int(re.search(r"\((\d+) bytes\)", stdout).group(1))  # type: ignore[union-attr]
    assert size == j["size"] == out.stat().st_size
    assert "--from" in invoke("record", "--help").stdout


def test_record_from_snapshot_keeps_one_starting_state_when_the_ring_has_wrapped(tmp_path: Path) -> None:
    """The subscriber cannot replay from seq 0 and resyncs by its own snapshot: the log holds one."""
    recs, _, _, out = _capture(tmp_path, "snapshot", buffer_steps=8)
    kinds = [r.kind for r in recs]
    n = kinds.count("snapshot")
    assert kinds[0] == "reset" and n > 0 and kinds[1 : 1 + n] == ["snapshot"] * n
    assert set(kinds[1 + n :]) == {"live"} | ({"replay"} & set(kinds))  # no second reset or snapshot
    _verified(out)


def test_record_from_oldest_starts_with_the_kept_history(tmp_path: Path) -> None:
    recs, _, _, out = _capture(tmp_path, "oldest")
    assert [r.kind for r in recs[:3]] == ["replay"] * 3 and recs[0].seq == 0
    assert "reset" not in {r.kind for r in recs}
    _verified(out)


def test_record_from_now_leaves_the_history_out(tmp_path: Path) -> None:
    recs, stdout, _, out = _capture(tmp_path, "now")
    assert recs[0].kind == "live" and recs[0].seq is not None and recs[0].seq >= 40
    assert {r.kind for r in recs} <= {"live", "replay"} and "left out" in stdout
    _verified(out)


def test_record_from_snapshot_without_snapshots_falls_back_to_oldest(tmp_path: Path) -> None:
    recs, _, err, out = _capture(tmp_path, "snapshot", snapshots=False)
    assert "no snapshot" in err and "oldest kept batch" in err
    assert recs[0].kind == "replay" and recs[0].seq == 0
    _verified(out)


def test_record_from_rejects_an_unknown_start(tmp_path: Path) -> None:
    r = invoke("record", "--publisher", "w0=tcp://127.0.0.1:1", "-o", str(tmp_path / "x.kvlog"), "--from", "yesterday")
    assert r.returncode == 2 and "--from must be one of snapshot, oldest, now" in r.stderr


# ---------------------------------------------------------------- a bad message is skipped, never fatal
@pytest.mark.subprocess
def test_record_skips_a_message_whose_topic_is_over_65535_bytes(tmp_path: Path) -> None:
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    ep = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    out = tmp_path / "t.kvlog"
    try:
        p = subprocess.Popen(
            _kv("record", "--publisher", f"w0={ep}", "-o", str(out), "--count", "5", "--duration", "30"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None and p.stdout.readline().startswith("recording")
        seq = 0
        while p.poll() is None and seq < 3000:  # every other message has a 70,000-byte topic
            topic = b"t" * 70000 if seq % 2 else b"kv"
            pub.send_multipart([topic, pack_seq(seq), payload([], ts=float(seq))])
            seq += 1
            time.sleep(0.01)
        stdout, err = p.communicate(timeout=30)
    finally:
        pub.close(0)
    assert p.returncode == 0, err
    assert "could not be recorded and was skipped (record topic is 70000 bytes" in err
    assert re.search(r"skipped \d+ that could not be stored", stdout), stdout
    recs = list(read_records(out))
    assert len(recs) == 5 and all(r.topic == "kv" and r.seq % 2 == 0 for r in recs)  # type: ignore[operator]


# ---------------------------------------------------------------- bad outputs
def test_record_refuses_a_directory_and_a_fifo_as_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvevents.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["record", "--publisher", "w0=tcp://127.0.0.1:1", "-o", str(tmp_path), "--force", "--duration", "1"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert f"{tmp_path} is a directory: give a file name for the log" in err and "--force" not in err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a reader exists: an old build would not block either
    try:
        with pytest.raises(SystemExit) as exc:
            main(["record", "--publisher", "w0=tcp://127.0.0.1:1", "-o", str(fifo), "--duration", "1"])
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "not a regular file" in err and err.count("\n") == 1


# ---------------------------------------------------------------- a replayer binds
@pytest.mark.subprocess
def test_replay_binds_its_endpoint_by_default(tmp_path: Path) -> None:
    src = tmp_path / "r.kvlog"
    with RecordWriter(src) as w:
        for i in range(5):
            w.write(payload([], ts=float(i)), source="w0", seq=i, recv_time=float(i) * 0.01)
    p = subprocess.Popen(
        _kv(
            "replay",
            str(src),
            "--to",
            "tcp://127.0.0.1:0",
            "--speed",
            "10",
            "--loop",
            "--delay",
            "0",
            "--heartbeat",
            "0",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    try:
        assert p.stdout is not None
        first = p.stdout.readline()
        assert "(publisher binds it)" in first, first
        endpoint = first.split("-> ")[1].split(",")[0].split()[0]
        assert endpoint.startswith("tcp://127.0.0.1:") and not endpoint.endswith(":0")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)  # what `kvevents tail ENDPOINT` does
        assert sub.poll(10_000), "nothing arrived from the replayer"
        frames = sub.recv_multipart()
        assert len(frames) == 3 and len(frames[1]) == 8
    finally:
        sub.close(0)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "Traceback" not in err, err


def test_readme_replay_row_mentions_source() -> None:
    readme = README.read_text()
    row = next(x for x in readme.splitlines() if x.startswith("| `kvevents replay"))
    assert "--source" in row and "binds" in row


def test_hwm_drops_are_documented_where_publishers_look() -> None:
    from kvevents.zeromq.metrics import PUBLISHER_METRICS

    root = REPO
    assert "HWM drops are not seen here" in PUBLISHER_METRICS["batches_published"][1]
    assert "high-water mark" in (root / "schemas" / "README.md").read_text()
    assert "high-water mark" in (root / "README.md").read_text()
