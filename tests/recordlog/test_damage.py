"""Record logs that cannot be fooled: a damaged file header, planted symlinks, oversized fields,
paths that are not regular files (issue: storage and logs that cannot be fooled)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Iterator

import pytest

from kvevents.events import AllBlocksCleared, decode_batch
from kvevents.recordlog import (
    HEADER_SIZE,
    Recorder,
    RecordLogError,
    RecordLogWarning,
    RecordReader,
    RecordWriter,
    read_records,
    repair_log,
)
from kvevents.recordlog.format import encode_header
from tests.helpers.recordlog import payload


def _write(path: Path, n: int = 30) -> list[bytes]:
    pays = [payload([AllBlocksCleared()] * (i % 3), ts=float(i)) for i in range(n)]
    with RecordWriter(path, durability="buffered") as w:
        for i, x in enumerate(pays):
            w.write(x, source="s", seq=i, recv_time=float(i))
    return pays


def _quiet(path: Path) -> tuple[list, RecordReader]:
    r = RecordReader(path, on_damage=lambda d: None)
    return list(r), r


# ---------------------------------------------------------------- item 8: a damaged file header
@pytest.mark.parametrize("bit", range(HEADER_SIZE * 8))
def test_one_flipped_header_bit_keeps_every_record(tmp_path: Path, bit: int) -> None:
    p = tmp_path / "h.kvlog"
    pays = _write(p)
    raw = bytearray(p.read_bytes())
    raw[bit // 8] ^= 1 << (bit % 8)
    p.write_bytes(bytes(raw))
    recs, reader = _quiet(p)
    assert [r.payload for r in recs] == pays
    assert [(d.kind, d.offset, d.length) for d in reader.damage] == [("header", 0, HEADER_SIZE)]


def test_a_damaged_header_warns_and_repair_rewrites_it(tmp_path: Path) -> None:
    p = tmp_path / "h.kvlog"
    pays = _write(p)
    raw = bytearray(p.read_bytes())
    raw[0:HEADER_SIZE] = bytes(HEADER_SIZE)  # the whole header zeroed: the first record still frames
    p.write_bytes(bytes(raw))
    with pytest.warns(RecordLogWarning, match="damaged file header"):
        assert [r.payload for r in read_records(p)] == pays
    dry = repair_log(p, dry_run=True)
    assert dry.header_damaged and p.read_bytes()[:HEADER_SIZE] == bytes(HEADER_SIZE)
    res = repair_log(p)
    assert res.header_damaged and res.changed and res.records == len(pays)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.payload for r in read_records(p)] == pays
    assert not repair_log(p).changed
    with RecordWriter(p, append=True) as w:  # append works on a log whose header was damaged, too
        w.write(pays[0], source="s", seq=99)
    assert len(list(read_records(p))) == len(pays) + 1


def test_a_header_only_log_with_a_flipped_bit_is_an_empty_log(tmp_path: Path) -> None:
    p = tmp_path / "e.kvlog"
    RecordWriter(p).close()
    raw = bytearray(p.read_bytes())
    raw[3] ^= 0x20
    p.write_bytes(bytes(raw))
    recs, reader = _quiet(p)
    assert recs == [] and [d.kind for d in reader.damage] == ["header"]


def test_append_to_a_log_with_a_damaged_header_rewrites_the_header(tmp_path: Path) -> None:
    p = tmp_path / "a.kvlog"
    _write(p, 3)
    raw = bytearray(p.read_bytes())
    raw[9] ^= 1
    p.write_bytes(bytes(raw))
    with RecordWriter(p, append=True, on_damage=lambda d: None) as w:
        w.write(b"\x92\x00\x90", source="s", seq=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.seq for r in read_records(p)] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"PK\x03\x04 definitely a zip file, not a log at all", "wrong magic"),
        (b"KVEVLOG\x00\x02\x00\x00\x00" + bytes(4), "header CRC"),
    ],
)
def test_files_that_are_not_logs_are_still_refused(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "x.kvlog"
    p.write_bytes(content)
    with pytest.raises(RecordLogError, match=message):
        list(read_records(p))


# ---------------------------------------------------------------- item 9: repair never follows a planted symlink
def _corrupt_middle(p: Path) -> list[bytes]:
    pays = _write(p, 10)
    off = [r.offset for r in read_records(p)][4]
    raw = bytearray(p.read_bytes())
    raw[off + 30] ^= 0x10
    p.write_bytes(bytes(raw))
    return pays


def test_drop_corrupt_does_not_follow_a_symlink_at_the_old_temp_name(tmp_path: Path) -> None:
    p = tmp_path / "l.kvlog"
    pays = _corrupt_middle(p)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, str(p) + ".repair-tmp")
    res = repair_log(p, drop_corrupt=True)
    assert res.rewritten and victim.read_bytes() == b"precious"
    assert [r.payload for r in read_records(p)] == pays[:4] + pays[5:]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["l.kvlog", "l.kvlog.repair-tmp", "victim"]


def test_drop_corrupt_refuses_a_symlink_at_its_temp_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import secrets

    p = tmp_path / "l.kvlog"
    _corrupt_middle(p)
    before = p.read_bytes()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    monkeypatch.setattr(secrets, "token_hex", lambda n: "fixed")  # a temp name someone guessed
    os.symlink(victim, f"{p}.fixed.repair-tmp")
    with pytest.raises(RecordLogError, match="exists"):
        repair_log(p, drop_corrupt=True)
    assert victim.read_bytes() == b"precious" and p.read_bytes() == before
    assert os.path.islink(f"{p}.fixed.repair-tmp")  # not ours: left alone


def test_repair_keeps_the_file_mode(tmp_path: Path) -> None:
    p = tmp_path / "m.kvlog"
    _corrupt_middle(p)
    os.chmod(p, 0o640)
    assert repair_log(p, drop_corrupt=True).rewritten
    assert (p.stat().st_mode & 0o777) == 0o640


# ---------------------------------------------------------------- item 10: a bad message is skipped, never fatal
def test_recorder_skips_a_message_with_a_topic_over_65535_bytes(tmp_path: Path) -> None:
    sub = pytest.importorskip("kvevents.zeromq.subscriber")
    pay = payload([AllBlocksCleared()])
    batch = decode_batch(pay)
    p = tmp_path / "r.kvlog"
    with RecordWriter(p) as w:
        rec = Recorder(w)
        for seq in range(6):
            topic = "t" * 70000 if seq == 2 else "kv"
            rec.on_delivery(sub.Delivery("w0", seq, batch, pay, topic, "live", 0, 7, "tcp://x:1", 1.0 + seq))
        assert not rec.done.is_set() and rec.error is None
        assert rec.batches == 5 and rec.skipped == 1 and "topic is 70000 bytes" in (rec.skip_reason or "")
    assert [r.seq for r in read_records(p)] == [0, 1, 3, 4, 5]


def test_recorder_still_stops_when_the_writer_fails(tmp_path: Path) -> None:
    sub = pytest.importorskip("kvevents.zeromq.subscriber")
    pay = payload([])
    w = RecordWriter(tmp_path / "c.kvlog")
    w.close()
    rec = Recorder(w)
    rec.on_delivery(sub.Delivery("w0", 0, decode_batch(pay), pay))
    assert isinstance(rec.error, RecordLogError) and rec.done.is_set() and rec.skipped == 0


# ---------------------------------------------------------------- item 11: a FIFO is refused, never waited on
@pytest.fixture()
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO holding a log header, kept open at both ends, so a regression fails instead of hanging."""
    f = tmp_path / "fifo.kvlog"
    os.mkfifo(f)
    fd = os.open(f, os.O_RDWR | os.O_NONBLOCK)
    os.write(fd, encode_header() * 4)
    yield f
    os.close(fd)


def test_readers_and_writers_refuse_a_fifo(fifo: Path) -> None:
    with pytest.raises(RecordLogError, match="not a regular file"):
        RecordReader(fifo)
    with pytest.raises(RecordLogError, match="not a regular file"):
        repair_log(fifo)
    with pytest.raises(RecordLogError, match="not a regular file"):
        RecordWriter(fifo)
    with pytest.raises(RecordLogError, match="not a regular file"):
        RecordWriter(fifo, append=True)


def test_writer_refuses_a_directory(tmp_path: Path) -> None:
    with pytest.raises(RecordLogError, match="is a directory"):
        RecordWriter(tmp_path)
    with pytest.raises(RecordLogError, match="is a directory"):
        RecordWriter(tmp_path, append=True)
