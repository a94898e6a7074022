"""Record log library: format round trip, damage detection and resync, repair, stats, verify, export."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvevents.hashing import Namespace, event_hashes, to_int64
from kvevents.recordlog import (
    HEADER_SIZE,
    MAGIC,
    RecordLogError,
    RecordLogWarning,
    RecordReader,
    RecordWriter,
    inspect_log,
    iter_jsonl,
    paced,
    parse_speed,
    read_records,
    repair_log,
    select_records,
    verify_log,
)
from tests.helpers.recordlog import PAGE, chain_events, payload, write_log


def _write_many(path: Path, n: int = 200) -> list[bytes]:
    pays = [payload([AllBlocksCleared()] * (i % 4), ts=float(i)) for i in range(n)]
    with RecordWriter(path) as w:
        for i, p in enumerate(pays):
            w.write(
                p,
                source=f"src{i % 3}",
                endpoint="tcp://h:1",
                topic="kv",
                seq=i,
                epoch=2**62 + i,
                dp_rank=i % 2,
                kind=("live", "replay", "snapshot")[i % 3],
                recv_time=100.0 + i,
            )
    return pays


def _quiet(path: Path) -> tuple[list, RecordReader]:
    r = RecordReader(path, on_damage=lambda d: None)
    return list(r), r


def test_round_trip_keeps_every_field(tmp_path: Path) -> None:
    p = tmp_path / "a.kvlog"
    pays = _write_many(p)
    recs = list(read_records(p))
    assert [r.payload for r in recs] == pays
    r = recs[7]
    assert (r.index, r.source, r.endpoint, r.topic, r.seq, r.epoch, r.dp_rank, r.kind, r.recv_time) == (
        7,
        "src1",
        "tcp://h:1",
        "kv",
        7,
        2**62 + 7,
        1,
        "replay",
        107.0,
    )
    assert open(p, "rb").read(8) == MAGIC


def test_none_fields_and_reset_markers(tmp_path: Path) -> None:
    p = tmp_path / "r.kvlog"
    with RecordWriter(p) as w:
        w.write(b"\x93\x00\x90\xc0", source="s", seq=None, epoch=None, dp_rank=None, kind="snapshot")
        w.write_reset(source="s", reason="gap", dp_rank=1)
    a, b = list(read_records(p))
    assert (a.seq, a.epoch, a.dp_rank, a.kind) == (None, None, None, "snapshot")
    assert (b.kind, b.reason, b.dp_rank) == ("reset", "gap", 1)


def test_torn_tail_is_skipped_with_a_warning_and_repaired(tmp_path: Path) -> None:
    p = tmp_path / "t.kvlog"
    pays = _write_many(p, 50)
    full = p.stat().st_size
    with open(p, "r+b") as f:
        f.truncate(full - 5)  # the last record lost its last 5 bytes (crash mid-write)
    with pytest.warns(RecordLogWarning, match="torn last record"):
        recs = list(read_records(p))
    assert [r.payload for r in recs] == pays[:-1]
    res = repair_log(p)
    assert res.torn_bytes > 0 and res.records == 49 and res.changed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(read_records(p))) == 49
    assert not repair_log(p).changed  # idempotent


def test_flipped_bit_is_detected_and_reader_resyncs(tmp_path: Path) -> None:
    p = tmp_path / "f.kvlog"
    pays = _write_many(p, 60)
    offsets = [r.offset for r in read_records(p)]
    data = bytearray(p.read_bytes())
    data[offsets[10] + 30] ^= 0x10  # inside record 10's body
    data[offsets[20] + 6] ^= 0x01  # inside record 20's length field
    p.write_bytes(bytes(data))
    with pytest.warns(RecordLogWarning, match="failed the CRC"):
        recs = list(read_records(p))
    assert [r.payload for r in recs] == pays[:10] + pays[11:20] + pays[21:]
    recs2, reader = _quiet(p)
    assert [d.kind for d in reader.damage] == ["corrupt", "corrupt"]
    res = repair_log(p)  # mid-file damage is kept unless asked
    assert not res.torn_bytes and len(res.corrupt) == 2 and not res.changed
    res = repair_log(p, drop_corrupt=True)
    assert res.rewritten
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.payload for r in read_records(p)] == [r.payload for r in recs2]


def test_damaged_sync_marker_and_garbage_tail(tmp_path: Path) -> None:
    p = tmp_path / "s.kvlog"
    pays = _write_many(p, 20)
    offsets = [r.offset for r in read_records(p)]
    data = bytearray(p.read_bytes())
    data[offsets[3]] ^= 0xFF
    p.write_bytes(bytes(data) + b"\x00garbage-after-the-end")
    recs, reader = _quiet(p)
    assert [r.payload for r in recs] == pays[:3] + pays[4:]
    assert [d.kind for d in reader.damage] == ["corrupt", "torn"]


def test_small_chunks_read_the_same(tmp_path: Path) -> None:
    p = tmp_path / "c.kvlog"
    pays = _write_many(p, 300)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 4
    p.write_bytes(bytes(data))
    a = [r.payload for r in RecordReader(p, on_damage=lambda d: None)]
    b = [r.payload for r in RecordReader(p, on_damage=lambda d: None, chunk_size=4096)]
    assert a == b and len(a) == len(pays) - 1


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty file"),
        (b"NOTALOG!" + bytes(8), "wrong magic"),
        (b"KVEV", "truncated header"),
        (MAGIC + b"\x01\x00", "truncated header"),
        (MAGIC + bytes(8), "header CRC"),
    ],
)
def test_bad_files_raise_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad.kvlog"
    p.write_bytes(content)
    with pytest.raises(RecordLogError, match=message):
        list(read_records(p))
    assert isinstance(RecordLogError("x"), ValueError)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RecordLogError, match="no such file"):
        RecordReader(tmp_path / "nope.kvlog")


def test_header_only_file_is_an_empty_log(tmp_path: Path) -> None:
    p = tmp_path / "h.kvlog"
    RecordWriter(p).close()
    assert p.stat().st_size == HEADER_SIZE
    assert list(read_records(p)) == []


def test_append_cuts_a_torn_tail_first(tmp_path: Path) -> None:
    p = tmp_path / "ap.kvlog"
    pays = _write_many(p, 10)
    with open(p, "ab") as f:
        f.write(b"\xc3KVR\x00\x01")  # a torn header of an 11th record
    with pytest.warns(RecordLogWarning):
        w = RecordWriter(p, append=True)
    with w:
        assert w.records == 10
        w.write(b"\x92\x00\x90", source="x", seq=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recs = list(read_records(p))
    assert [r.payload for r in recs[:10]] == pays and recs[10].seq == 10


def test_writer_rejects_bad_input_without_writing(tmp_path: Path) -> None:
    p = tmp_path / "w.kvlog"
    with RecordWriter(p) as w:
        with pytest.raises(RecordLogError):
            w.write(b"x", source="s", kind="bogus")
        with pytest.raises(RecordLogError):
            w.write("not bytes", source="s")  # type: ignore[arg-type]
        size = p.stat().st_size
    assert size == HEADER_SIZE and list(read_records(p)) == []


def test_stats_counts_gaps_epochs_and_rates(tmp_path: Path) -> None:
    p = tmp_path / "st.kvlog"
    ns = Namespace()
    batches = chain_events(ns)
    with RecordWriter(p) as w:
        for i, evs in enumerate(batches):
            seq = i if i < 4 else i + 3  # 3 seqs missing after seq 3
            w.write(payload(evs), source="w0", seq=seq, epoch=7, recv_time=10.0 + i)
        w.write(payload([], epoch=8), source="w0", seq=99, epoch=8, recv_time=30.0)  # restart
        w.write(b"\xc1junk", source="w1", seq=0, recv_time=30.0)
    st = inspect_log(p)
    assert st.records == len(batches) + 2
    assert st.event_types["BlockStored"] == 6 and st.event_types["AllBlocksCleared"] == 1
    assert st.blocks["stored"] == 3 * (2 + 3) and st.media["GPU"]["removed_blocks"] == 2
    assert [(g["after"], g["seq"], g["missing"]) for g in st.gaps] == [(3, 7, 3)]
    assert st.epoch_changes and st.epoch_changes[0]["epoch"] == 8
    assert st.decode_errors == 1 and st.sources["w0"].heartbeats == 1
    assert st.duration_s == 20.0 and st.rates()["records_per_s"] == pytest.approx(st.records / 20.0)
    json.dumps(st.as_dict())


def test_verify_passes_a_clean_stream_with_salts(tmp_path: Path) -> None:
    p = tmp_path / "clean.kvlog"
    batches = chain_events(Namespace()) + chain_events(Namespace("lora-a", "tenant"), seed=1)
    # a salted head published without its cache_salt field: only --salt makes it verifiable
    toks = list(range(PAGE * 2))
    hx = event_hashes(toks, PAGE, Namespace(cache_salt="hidden"))
    batches.append([BlockStored([to_int64(h) for h in hx], None, toks, PAGE, None, "GPU", None)])
    write_log(p, batches)
    rep = verify_log(p, PAGE, ["hidden"])
    assert rep.ok, [str(v) for v in rep.violations]
    assert rep.heads["unseeded"] == 3 and rep.heads["salt:tenant"] == 3 and rep.heads["salt:hidden"] == 1
    assert rep.blocks_verified == 6 * (2 + 3) + 2 and rep.blocks_unverifiable == 0
    bad = verify_log(p, PAGE)  # without --salt the hidden-salt head matches no allowed head
    assert [v.code for v in bad.violations] == ["hash-mismatch"]
    assert bad.violations[0].record == len(batches) - 1


def test_verify_catches_extra_key_mixed_into_published_hashes(tmp_path: Path) -> None:
    p = tmp_path / "bad.kvlog"
    write_log(p, chain_events(Namespace("lora-a"), published="storage"))
    rep = verify_log(p, PAGE)
    heads = [v for v in rep.violations if v.code == "hash-mismatch"]
    assert len(heads) == 3 and "extra_key" in heads[0].message
    assert heads[0].record == 1 and heads[0].event == 0


def test_verify_catches_orphans_and_dead_removes(tmp_path: Path) -> None:
    p = tmp_path / "o.kvlog"
    toks = list(range(PAGE))
    h = to_int64(event_hashes(toks, PAGE, None)[0])
    batches = [
        [AllBlocksCleared()],
        [BlockStored([12345], h, list(range(PAGE)), PAGE, None, "GPU", None)],  # parent never stored
        [BlockRemoved([h], "GPU")],  # nothing live
        [BlockStored([h], None, toks, PAGE, None, "GPU", None)],
        [BlockRemoved([h], "CPU_PINNED")],  # live on GPU, not on CPU
        [BlockStored([h + 1], None, toks[:3], PAGE, None, "GPU", None)],  # 3 tokens for 1 page
    ]
    write_log(p, batches)
    rep = verify_log(p, PAGE)
    got = [(v.record, v.code) for v in rep.violations]
    assert (1, "parent-missing") in got and (2, "remove-not-live") in got
    assert (4, "remove-not-live") in got and (5, "token-count") in got
    assert all(v.code != "hash-mismatch" for v in rep.violations if v.record == 3)


def test_verify_is_lenient_before_the_first_clear_and_after_a_reset(tmp_path: Path) -> None:
    p = tmp_path / "mid.kvlog"
    batches = chain_events(Namespace())[1:]  # recording started mid-stream: no clear
    with RecordWriter(p) as w:
        for i, evs in enumerate(batches):
            w.write(payload(evs), source="w0", seq=100 + i)
        w.write_reset(source="w0", reason="gap")
        w.write(payload([BlockRemoved([1], "GPU")]), source="w0", seq=500)
    rep = verify_log(p, PAGE)
    assert rep.ok and rep.removes_unchecked == 1


def test_verify_with_the_reference_cache(tmp_path: Path) -> None:
    cache_mod = pytest.importorskip("kvevents.cache")
    if not hasattr(cache_mod, "RadixCache"):
        pytest.skip("kvevents.cache.RadixCache not available yet")
    from kvevents.sim.worker import Workload  # noqa: PLC0415

    cache = cache_mod.RadixCache(PAGE, capacity_pages=64)
    p = tmp_path / "cache.kvlog"
    with RecordWriter(p) as w:
        for i, req in enumerate(Workload(seed=3, page_size=PAGE).take(300)):
            cache.insert(req.tokens, req.namespace, lora_name=req.lora_name, session_id=req.session_id)
            if cache.num_pages > 48:
                cache.evict(16)
            w.write(payload(cache.take_events()), source="cache", seq=i)
    rep = verify_log(p, PAGE)
    assert rep.ok, [str(v) for v in rep.violations[:5]]
    assert rep.blocks_verified > 100


def test_export_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "e.kvlog"
    write_log(p, chain_events(Namespace(cache_salt="s")))
    with RecordWriter(p, append=True) as w:
        w.write(b"\xc1", source="w0", seq=99)
    lines = [json.loads(x) for x in iter_jsonl(p, payload=True)]
    assert lines[0]["batch"]["events"] == [{"type": "AllBlocksCleared"}]
    ev = lines[1]["batch"]["events"][0]
    assert ev["type"] == "BlockStored" and ev["cache_salt"] == "s" and ev["parent_block_hash"] is None
    assert lines[-1]["decode_error"] and lines[-1]["payload_b64"] == "wQ=="


def test_select_and_pace(tmp_path: Path) -> None:
    p = tmp_path / "p.kvlog"
    write_log(p, [[]] * 10, start_seq=5, t0=0.0, dt=1.0)
    assert [r.seq for r in select_records(p, from_seq=7, to_seq=9)] == [7, 8, 9]
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    out = list(paced(select_records(p), 10.0, clock=lambda: now[0], sleep=sleep))
    assert len(out) == 10 and sum(slept) == pytest.approx(0.9)
    assert list(paced(select_records(p), None, sleep=sleep)) and len(slept) == 9
    assert parse_speed("max") is None and parse_speed("10") == 10.0
    with pytest.raises(ValueError):
        parse_speed("fast")


def test_reader_memory_is_bounded_by_chunks(tmp_path: Path) -> None:
    p = tmp_path / "big.kvlog"
    blob = os.urandom(64 * 1024)
    with RecordWriter(p, durability="buffered") as w:
        for i in range(64):
            w.write(blob, source="s", seq=i)
    r = RecordReader(p, chunk_size=8192)
    n = 0
    for rec in r:
        assert rec.payload == blob
        n += 1
    assert n == 64 and r.valid_end == p.stat().st_size


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st


@given(st.data())
def test_any_single_bit_flip_loses_at_most_the_record_it_hits(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    p = tmp_path_factory.mktemp("flip") / "f.kvlog"
    pays = [payload([AllBlocksCleared()] * (i % 3), ts=float(i)) for i in range(12)]
    with RecordWriter(p, durability="buffered") as w:
        for i, x in enumerate(pays):
            w.write(x, source="s", seq=i)
    offsets = [r.offset for r in read_records(p)] + [p.stat().st_size]
    raw = bytearray(p.read_bytes())
    pos = data.draw(st.integers(HEADER_SIZE, len(raw) - 1), label="byte")
    raw[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    p.write_bytes(bytes(raw))
    hit = max(i for i in range(12) if offsets[i] <= pos)
    recs, reader = _quiet(p)
    assert [r.payload for r in recs] == pays[:hit] + pays[hit + 1 :]
    assert len(reader.damage) == 1


@given(st.data())
def test_truncation_anywhere_keeps_the_complete_records(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    p = tmp_path_factory.mktemp("cut") / "c.kvlog"
    pays = [payload([], ts=float(i)) for i in range(8)]
    with RecordWriter(p, durability="buffered") as w:
        for i, x in enumerate(pays):
            w.write(x, source="s", seq=i)
    ends = [r.offset for r in read_records(p)][1:] + [p.stat().st_size]
    cut = data.draw(st.integers(HEADER_SIZE, p.stat().st_size), label="size")
    with open(p, "r+b") as f:
        f.truncate(cut)
    recs, reader = _quiet(p)
    whole = sum(1 for e in ends if e <= cut)
    assert [r.payload for r in recs] == pays[:whole]
    assert reader.valid_end == (ends[whole - 1] if whole else HEADER_SIZE)
    assert [d.kind for d in reader.damage] == (["torn"] if cut > reader.valid_end else [])


def test_reading_a_log_that_is_still_being_written(tmp_path: Path) -> None:
    p = tmp_path / "live.kvlog"
    w = RecordWriter(p)  # durability "flush": every record is in the file once write() returns
    for i in range(5):
        w.write(b"\x92\x00\x90", source="s", seq=i)
    reader = RecordReader(p)  # sees the 5 records present when it opened
    got = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rec in reader:
            got.append(rec.seq)
            w.write(b"\x92\x00\x90", source="s", seq=100 + rec.seq)  # appended meanwhile: not damage
    w.close()
    assert got == [0, 1, 2, 3, 4] and reader.damage == []
    assert len(list(read_records(p))) == 10


def test_recorder_writes_deliveries_and_resets_and_stops_on_errors(tmp_path: Path) -> None:
    sub = pytest.importorskip("kvevents.zeromq.subscriber")
    from kvevents.events import decode_batch  # noqa: PLC0415
    from kvevents.recordlog import Recorder  # noqa: PLC0415

    p = tmp_path / "r.kvlog"
    pay = payload([AllBlocksCleared()], rank=1, epoch=5)
    w = RecordWriter(p)
    rec = Recorder(w, count=2)
    rec.on_delivery(sub.Delivery("w0", 3, decode_batch(pay), pay, "kv", "replay", 1, 5, "tcp://x:1", 12.5))
    rec.on_reset(sub.Reset("w0", 1, "gap", 5))
    rec.on_delivery(sub.Delivery("w0", 9, decode_batch(pay), pay, "kv", "snapshot", 1, 5, "tcp://x:1", 13.0))
    rec.on_delivery(sub.Delivery("w0", 10, decode_batch(pay), pay, "kv", "live", 1, 5, "tcp://x:1", 14.0))
    assert rec.done.is_set() and rec.batches == 2 and rec.resets == 1
    w.close()
    got = [(r.kind, r.seq, r.dp_rank, r.epoch, r.topic, r.endpoint, r.recv_time) for r in read_records(p)]
    assert got == [
        ("replay", 3, 1, 5, "kv", "tcp://x:1", 12.5),
        ("reset", None, 1, None, "", "", got[1][6]),
        ("snapshot", 9, 1, 5, "kv", "tcp://x:1", 13.0),
    ]
    broken = Recorder(w)  # writer closed: the error is kept and recording stops
    broken.on_delivery(sub.Delivery("w0", 11, decode_batch(pay), pay))
    assert isinstance(broken.error, RecordLogError) and broken.done.is_set()
