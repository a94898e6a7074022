"""`kvevents log repair` on a log that is a symbolic link (issue 28, part 4): refused with one line
and exit 2, the link and its target untouched (with or without --drop-corrupt); --dry-run still
reports through the link; the target itself repairs as usual. Real CLI, real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvevents.recordlog import RecordWriter, read_records, repair_log
from tests.helpers.cli import CliResult, invoke

PAYLOAD = b"\x94\xcbA\xd9T\xfc@\x00\x00\x00\x90\x00\x07"  # msgpack [ts, [], 0, 7]: an empty batch


def _damaged_log(path: Path, *, corrupt: bool) -> bytes:
    with RecordWriter(path, durability="buffered") as w:
        for i in range(6):
            w.write(PAYLOAD, source="w0", seq=i)
    raw = bytearray(path.read_bytes())
    if corrupt:  # flip a byte inside the third record: a corrupt region with valid records after it
        raw[16 + 2 * (len(raw) - 16) // 6 + 20] ^= 0xFF
    raw += b"\xc3KVR\x00\x00"  # a torn last record
    path.write_bytes(bytes(raw))
    return bytes(raw)


def _kv(*args: str) -> CliResult:
    return invoke(*args)  # the real entry point, in process: a file command that ends by itself


@pytest.mark.parametrize("extra", [[], ["--drop-corrupt"]])
def test_repair_refuses_a_symlink_and_changes_nothing(tmp_path: Path, extra: list[str]) -> None:
    target = tmp_path / "real.kvlog"
    before = _damaged_log(target, corrupt=bool(extra))
    link = tmp_path / "link.kvlog"
    link.symlink_to(target)
    r = _kv("log", "repair", str(link), *extra)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout
    assert "is a symbolic link" in lines[0] and str(target) in lines[0]
    assert link.is_symlink() and link.resolve() == target  # the link is still a link
    assert target.read_bytes() == before  # and its target was not touched


def test_dry_run_reports_through_the_link_and_the_target_repairs(tmp_path: Path) -> None:
    target = tmp_path / "real.kvlog"
    before = _damaged_log(target, corrupt=False)
    link = tmp_path / "link.kvlog"
    link.symlink_to(target)
    r = _kv("log", "repair", str(link), "--dry-run")
    assert r.returncode == 0 and "would cut a torn tail of 6 bytes" in r.stdout, r.stdout + r.stderr
    assert target.read_bytes() == before
    r = _kv("log", "repair", str(target))
    assert r.returncode == 0 and "cut a torn tail of 6 bytes" in r.stdout
    assert len(list(read_records(target))) == 6 and link.is_symlink()


def test_the_library_raises_a_record_log_error(tmp_path: Path) -> None:
    target = tmp_path / "real.kvlog"
    _damaged_log(target, corrupt=False)
    link = tmp_path / "link.kvlog"
    link.symlink_to(target)
    from kvevents.recordlog import RecordLogError

    with pytest.raises(RecordLogError, match="symbolic link"):
        repair_log(link)
    assert repair_log(link, dry_run=True).torn_bytes == 6
