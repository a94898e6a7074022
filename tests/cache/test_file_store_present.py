"""FileStore.present: the header-only presence check the HiCache backend's batch_exists relies on."""

from __future__ import annotations

from pathlib import Path

from kvevents.cache import FileStore

KEY, OTHER = "ab" * 32, "cd" * 32


def test_present_reads_the_header_not_the_payload(tmp_path: Path) -> None:
    s = FileStore(tmp_path, fsync=False)
    assert not s.present(KEY)
    s.put(KEY, b"p" * 100)
    assert s.present(KEY)
    path = s.path_for(KEY)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # a payload bit: only get() can tell
    path.write_bytes(bytes(raw))
    assert s.present(KEY) and s.get(KEY) is None and not s.present(KEY)
    assert s.stats()["corrupt"] == 1


def test_present_drops_short_and_misplaced_files(tmp_path: Path) -> None:
    s = FileStore(tmp_path, fsync=False)
    s.put(KEY, b"a" * 10)
    s.put(OTHER, b"b" * 10)
    s.path_for(OTHER).write_bytes(s.path_for(OTHER).read_bytes()[:-1])  # truncated
    s.path_for(KEY).write_bytes(b"")
    assert not s.present(OTHER) and not s.present(KEY)  # short and empty: corrupt
    assert s.stats()["corrupt"] == 2 and s.keys() == []
    s.put(KEY, b"a" * 10)
    s.put(OTHER, b"b" * 10)
    s.path_for(KEY).write_bytes(s.path_for(OTHER).read_bytes())  # another key's valid page
    assert not s.present(KEY) and s.stats()["misplaced"] == 1 and not s.path_for(KEY).exists()
    assert s.present(OTHER)
    s.path_for(KEY).mkdir()
    assert not s.present(KEY) and s.stats()["corrupt"] == 3
