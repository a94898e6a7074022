"""`kvevents log inspect|repair|export` through the real CLI (in-process: files in, text out): output,
exit codes, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvevents.hashing import Namespace
from kvevents.recordlog import MAGIC, RecordWriter, read_records
from tests.helpers.cli import invoke as kv
from tests.helpers.recordlog import PAGE, chain_events, payload, write_log


@pytest.fixture()
def clean_log(tmp_path: Path) -> Path:
    p = tmp_path / "clean.kvlog"
    write_log(p, chain_events(Namespace()) + chain_events(Namespace("lora-b", "t1"), seed=2))
    return p


def test_inspect_tables_and_json(clean_log: Path) -> None:
    r = kv("log", "inspect", str(clean_log))
    assert r.returncode == 0, r.stderr
    assert "BlockStored 12" in r.stdout and "by source" in r.stdout and "w0" in r.stdout
    j = json.loads(kv("log", "inspect", str(clean_log), "--json").stdout)
    assert j["records"] == 18 and j["event_types"]["AllBlocksCleared"] == 2
    assert j["media"]["GPU"]["stored_blocks"] == 30 and j["sources"]["w0"]["first_seq"] == 0
    assert j["rates"]["records_per_s"] > 0 and j["gaps"] == []


def test_verify_passes_a_clean_stream(clean_log: Path) -> None:
    r = kv("log", "inspect", str(clean_log), "--verify", "--page-size", str(PAGE))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify: OK" in r.stdout and "30 blocks verified" in r.stdout


def test_verify_catches_extra_key_in_published_hashes(tmp_path: Path) -> None:
    p = tmp_path / "bad.kvlog"
    write_log(p, chain_events(Namespace("lora-a"), published="storage"))
    r = kv("log", "inspect", str(p), "--verify", "--page-size", str(PAGE), "--salt", "t1")
    assert r.returncode == 1
    lines = [x for x in r.stdout.splitlines() if x.startswith("violation")]
    assert len(lines) == 1 and "extra_key" in lines[0]  # one line per kind, with its count and first
    assert lines[0].startswith("violation hash-mismatch x3, the first at record 1 event 0")
    assert r.stderr.strip() == f"kvevents: check failed: 3 contract violation(s) in {p}"
    j = json.loads(kv("log", "inspect", str(p), "--verify", "-p", str(PAGE), "--json").stdout)
    assert [v["record"] for v in j["verify"]["violations"]] == [1, 4, 6]


def test_verify_takes_the_page_size_from_the_events(clean_log: Path) -> None:
    r = kv("log", "inspect", str(clean_log), "--verify")
    assert r.returncode == 0 and f"verify page size {PAGE} (the events' block_size)" in r.stdout, r.stdout
    assert "30 blocks verified" in r.stdout


def test_torn_tail_warning_then_repair(clean_log: Path) -> None:
    size = clean_log.stat().st_size
    with open(clean_log, "r+b") as f:
        f.truncate(size - 3)
    r = kv("log", "inspect", str(clean_log), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == 17
    assert "torn last record" in r.stderr and r.stderr.startswith("kvevents: warning:")
    r = kv("log", "repair", str(clean_log))
    assert r.returncode == 0 and "cut a torn tail" in r.stdout
    r = kv("log", "inspect", str(clean_log))
    assert r.returncode == 0 and r.stderr == ""
    assert "clean, 17 records" in kv("log", "repair", str(clean_log)).stdout


def test_flipped_bit_warning(clean_log: Path) -> None:
    offsets = [r.offset for r in read_records(clean_log)]
    data = bytearray(clean_log.read_bytes())
    data[offsets[5] + 40] ^= 0x80
    clean_log.write_bytes(bytes(data))
    r = kv("log", "export", str(clean_log), "--jsonl")
    assert r.returncode == 0
    assert "failed the CRC check" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    idx = [json.loads(x)["seq"] for x in r.stdout.splitlines()]
    assert idx == [i for i in range(18) if i != 5]


def test_export_jsonl(clean_log: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    r = kv("log", "export", str(clean_log), "--jsonl", "-o", str(out), "--payload")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 18 and rows[1]["batch"]["events"][0]["type"] == "BlockStored"
    assert rows[1]["source"] == "w0" and rows[1]["kind"] == "live" and rows[1]["payload_b64"]
    plain = kv("log", "export", str(clean_log))  # JSONL is the only format, so the default
    assert plain.returncode == 0 and [json.loads(x)["seq"] for x in plain.stdout.splitlines()] == list(range(18))


BAD_FILES = [
    (None, "no such file"),
    (b"", "empty file"),
    (b"PK\x03\x04 definitely a zip file", "wrong magic"),
    (MAGIC[:5], "truncated header"),
    (MAGIC + b"\x01\x00", "truncated header"),
]


def _bad_file(tmp_path: Path, content: bytes | None) -> Path:
    p = tmp_path / "x.kvlog"
    if content is not None:
        p.write_bytes(content)
    return p


@pytest.mark.parametrize("content, message", BAD_FILES)
def test_bad_files_give_one_line_and_exit_2(tmp_path: Path, content: bytes | None, message: str) -> None:
    r = kv("log", "inspect", str(_bad_file(tmp_path, content)))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and message in r.stderr and r.stderr.startswith("kvevents: error:")


@pytest.mark.parametrize("content, message", BAD_FILES)
@pytest.mark.parametrize(
    "command",
    [["log", "repair"], ["log", "export", "--jsonl"], ["log", "index"], ["replay", "--to", "tcp://127.0.0.1:1"]],
)
def test_bad_files_for_every_reading_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, message: str, command: list[str]
) -> None:
    from kvevents.cli import main

    p = str(_bad_file(tmp_path, content))
    args = command[:2] + [p] + command[2:] if command[0] == "log" else command[:1] + [p] + command[1:]
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_stats_show_gaps_and_resets(tmp_path: Path) -> None:
    p = tmp_path / "g.kvlog"
    with RecordWriter(p) as w:
        for s in (0, 1, 2, 6, 7):
            w.write(payload([]), source="w0", seq=s, recv_time=float(s))
        w.write_reset(source="w0", reason="restart")
        w.write(payload([], epoch=9), source="w0", seq=0, kind="snapshot", recv_time=8.0)
    r = kv("log", "inspect", str(p))
    assert "gap record 3 w0 rank 0: seq 2 -> 6 (3 missing)" in r.stdout
    assert "reset record 5 w0 rank None: restart" in r.stdout and "heartbeats" in r.stdout


# ---------------------------------------------------------------- honest output (newcomer issue) and damage
def test_torn_tail_before_any_record_is_worded_plainly(tmp_path: Path) -> None:
    p = tmp_path / "t.kvlog"
    RecordWriter(p).close()
    with open(p, "ab") as f:
        f.write(b"\xc3KVR\x00\x01")  # a torn first record
    r = kv("log", "inspect", str(p))
    assert r.returncode == 0 and "before the first record" in r.stderr and "record -1" not in r.stderr


def test_verify_says_what_a_corrupt_region_kept_unchecked(clean_log: Path) -> None:
    off = [r.offset for r in read_records(clean_log)][5]
    data = bytearray(clean_log.read_bytes())
    data[off + 40] ^= 0x80
    clean_log.write_bytes(bytes(data))
    r = kv("log", "inspect", str(clean_log), "--verify", "--page-size", str(PAGE))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify: OK" not in r.stdout
    assert "1 corrupt region (" in r.stdout
    assert "skipped unchecked" in r.stdout and f"at offset {off}" in r.stdout


def test_page_size_without_verify_is_a_usage_error(clean_log: Path) -> None:
    r = kv("log", "inspect", str(clean_log), "--page-size", "4")
    assert r.returncode == 2 and "--page-size is only used by --verify" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_rates_come_from_the_batches_own_timestamps(tmp_path: Path) -> None:
    """History replayed in the first second of a capture must not read as a burst of traffic."""
    p = tmp_path / "r.kvlog"
    with RecordWriter(p) as w:
        w.write(payload([], ts=50.0), source="w0", seq=None, kind="snapshot", recv_time=1000.0)
        for i in range(11):  # one batch per second of publisher time, all received within 0.1 s
            w.write(
                payload([], ts=100.0 + i),
                source="w0",
                seq=i,
                kind="replay" if i < 10 else "live",
                recv_time=1000.0 + i * 0.01,
            )
    j = json.loads(kv("log", "inspect", str(p), "--json").stdout)
    assert j["rate_clock"] == "batch_ts" and j["batch_span_s"] == 10.0
    assert abs(j["rates"]["records_per_s"] - 1.1) < 1e-9
    out = kv("log", "inspect", str(p)).stdout
    assert "1.1 records/s" in out and "own timestamps" in out


def test_a_damaged_header_is_read_and_repaired(clean_log: Path) -> None:
    data = bytearray(clean_log.read_bytes())
    data[2] ^= 0x04
    clean_log.write_bytes(bytes(data))
    r = kv("log", "inspect", str(clean_log), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["records"] == 18
    assert "damaged file header" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = kv("log", "repair", str(clean_log))
    assert r.returncode == 0 and "damaged file header rewritten" in r.stdout
    assert clean_log.read_bytes()[:8] == MAGIC
    assert kv("log", "inspect", str(clean_log)).stderr == ""


@pytest.mark.parametrize(
    "command",
    [
        ["log", "inspect"],
        ["log", "repair"],
        ["log", "export"],
        ["log", "index"],
        ["replay", "--to", "tcp://127.0.0.1:1"],
    ],
)
def test_every_log_tool_refuses_a_fifo_at_once(tmp_path: Path, command: list[str]) -> None:
    import os

    f = tmp_path / "fifo.kvlog"
    os.mkfifo(f)
    fd = os.open(f, os.O_RDWR | os.O_NONBLOCK)  # both ends open, a header inside: an old build reads, not hangs
    try:
        os.write(fd, MAGIC + b"\x01\x00\x00\x00" + bytes(4))
        args = command[:2] + [str(f)] + command[2:] if command[0] == "log" else command[:1] + [str(f)] + command[1:]
        r = kv(*args)
    finally:
        os.close(fd)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert (
        r.stderr.strip() == f"kvevents: error: {f}: is not a regular file (a FIFO, socket or device), not a record log"
    )
