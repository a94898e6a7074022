"""FileStore never hangs on, nor reads, what is not a page file (issue 28, part 4): a FIFO, a
1 GiB sparse file, a symlink (to a page outside the store, or as the fan-out directory) at a page
path are counted misses, checked by type and size before any read. Real files in a tmp dir."""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from kvevents.cache import FileStore

KEY = "ab" + "0" * 62


def _get_within(store: FileStore, key: str, seconds: float) -> tuple[bool, bytes | None]:
    """(finished in time, result) of store.get(key) on a helper thread (so a hang fails, not blocks)."""
    out: list[bytes | None] = []
    t = threading.Thread(target=lambda: out.append(store.get(key)), daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive()), (out[0] if out else None)


def test_a_fifo_at_a_page_path_is_a_counted_miss_not_a_hang(tmp_path: Path) -> None:
    s = FileStore(tmp_path, fsync=False)
    path = s.path_for(KEY)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    try:
        done, got = _get_within(s, KEY, 5.0)
        assert done, "get() hung on a FIFO"
        assert got is None and not s.contains(KEY)
        assert s.stats()["misses"] == 1 and s.stats()["corrupt"] == 2 and s.stats()["hits"] == 0
        assert path.exists()  # left alone; the next write replaces it
        s.put(KEY, b"page")
        assert s.get(KEY) == b"page"
    finally:
        try:  # unblock a reader that did hang (the old code), so its thread ends
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def test_a_1gib_sparse_file_at_a_page_path_is_never_read(tmp_path: Path) -> None:
    s = FileStore(tmp_path, fsync=False)
    path = s.path_for(KEY)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(1 << 30)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        got = s.get(KEY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got is None and s.stats()["corrupt"] == 1 and s.stats()["misses"] == 1
    assert peak < 1 << 20, f"{peak} bytes allocated for a page path holding a 1 GiB file"
    assert time.monotonic() - t0 < 1.0


def test_the_size_bound_follows_max_page_bytes(tmp_path: Path) -> None:
    s = FileStore(tmp_path, fsync=False, max_page_bytes=1000)
    s.put(KEY, b"x" * 1000)
    assert s.get(KEY) == b"x" * 1000  # exactly the bound: read
    with pytest.raises(ValueError, match="max_page_bytes"):
        s.put(KEY, b"x" * 1001)  # never written, so never refused on read
    big = FileStore(tmp_path, fsync=False)
    big.put(KEY, b"y" * 5000)
    assert s.get(KEY) is None and s.stats()["corrupt"] == 1  # a bigger page: not read by this store
    assert big.get(KEY) == b"y" * 5000  # and left alone for the store that wrote it
    with pytest.raises(ValueError, match="max_page_bytes"):
        FileStore(tmp_path, max_page_bytes=0)


def test_a_symlink_to_a_page_outside_the_store_is_not_followed(tmp_path: Path) -> None:
    outside = FileStore(tmp_path / "outside", fsync=False)
    outside.put(KEY, b"someone else's page")
    s = FileStore(tmp_path / "store", fsync=False)
    link = s.path_for(KEY)
    link.parent.mkdir(parents=True)
    link.symlink_to(outside.path_for(KEY))
    assert s.get(KEY) is None and not s.contains(KEY)
    assert s.stats()["corrupt"] == 2 and s.keys() == []
    assert outside.get(KEY) == b"someone else's page"  # the target is untouched
    s.put(KEY, b"ours")  # the write replaces the link itself, not its target
    assert s.get(KEY) == b"ours" and not link.is_symlink()
    assert outside.get(KEY) == b"someone else's page"


def test_a_symlinked_fanout_directory_is_neither_read_nor_written(tmp_path: Path) -> None:
    outside = FileStore(tmp_path / "outside", fsync=False)
    outside.put(KEY, b"outside page")
    s = FileStore(tmp_path / "store", fsync=False)
    (tmp_path / "store" / KEY[:2]).symlink_to(outside.path_for(KEY).parent)
    assert s.get(KEY) is None and s.stats()["corrupt"] == 1
    with pytest.raises(ValueError, match="not a page file"):
        s.put(KEY, b"would land outside")
    assert outside.get(KEY) == b"outside page"
