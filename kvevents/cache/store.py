"""Page stores for the storage tier ("L3"), keyed by the storage hash (schemas/README.md, "Storage tier and prefetch").

Keys are 64-char lowercase hex storage hashes, which already include the whole namespace, so a
store never needs to know about namespaces to keep them apart. `FileStore` writes each page
atomically (temp file, fsync, rename) with its key and a checksum in the header; a corrupt or
truncated page, or a valid page found under another key's name (a copy, rename or restore
mix-up), is read as a counted miss, removed, and never returned. The cache writes through to the store (see
kvevents/cache/tier.py for why), so a store outlives device resets and process restarts.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Protocol, runtime_checkable

__all__ = ["PageStore", "MemoryStore", "FileStore", "check_key", "MAX_PAGE_BYTES"]

_HEX = frozenset("0123456789abcdef")


def check_key(key: str) -> str:
    """Validate a storage key (64 lowercase hex chars); also keeps file paths inside the store."""
    if not isinstance(key, str) or len(key) != 64 or not _HEX.issuperset(key):
        raise ValueError(f"storage key must be 64 lowercase hex chars, got {key!r}")
    return key


def _check_data(data: bytes) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ValueError(f"page data must be bytes, got {type(data).__name__}")
    return bytes(data)


@runtime_checkable
class PageStore(Protocol):
    """What the cache needs from a storage tier: whole pages by storage hash."""

    def get(self, key: str) -> bytes | None:
        """The page's bytes, or None on a miss (a corrupt page is a miss)."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Store (or overwrite) one page."""
        ...

    def contains(self, key: str) -> bool:
        """True if a valid page is stored under `key` (a corrupt page is not stored)."""
        ...

    def delete(self, key: str) -> bool:
        """Remove one page; True if it was there."""
        ...

    def stats(self) -> dict[str, int]:
        """Counters: at least pages, hits, misses, corrupt, writes."""
        ...


class MemoryStore:
    """In-process page store; with `capacity_pages` it drops least recently used pages."""

    def __init__(self, capacity_pages: int | None = None) -> None:
        if capacity_pages is not None and (
            isinstance(capacity_pages, bool) or not isinstance(capacity_pages, int) or capacity_pages < 1
        ):
            raise ValueError(f"capacity_pages must be an integer >= 1 or None, got {capacity_pages!r}")
        self.capacity_pages = capacity_pages
        self._pages: OrderedDict[str, bytes] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.writes = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._pages)

    def get(self, key: str) -> bytes | None:
        data = self._pages.get(check_key(key))
        if data is None:
            self.misses += 1
            return None
        if self.capacity_pages is not None:
            self._pages.move_to_end(key)
        self.hits += 1
        return data

    def put(self, key: str, data: bytes) -> None:
        check_key(key)
        self._pages[key] = _check_data(data)
        self.writes += 1
        if self.capacity_pages is not None:
            self._pages.move_to_end(key)
            while len(self._pages) > self.capacity_pages:
                self._pages.popitem(last=False)
                self.dropped += 1

    def contains(self, key: str) -> bool:
        return check_key(key) in self._pages

    def delete(self, key: str) -> bool:
        return self._pages.pop(check_key(key), None) is not None

    def keys(self) -> list[str]:
        """Stored keys (oldest first when bounded)."""
        return list(self._pages)

    def stats(self) -> dict[str, int]:
        return {
            "pages": len(self._pages),
            "hits": self.hits,
            "misses": self.misses,
            "corrupt": 0,
            "writes": self.writes,
            "dropped": self.dropped,
        }


# FileStore page file: magic, payload length (u64 LE), the key (32 raw bytes), BLAKE2b-128 of
# key || payload, payload. A "KVP1" page (no key) from an older build reads as a counted miss.
_MAGIC = b"KVP2"
_HEADER = struct.Struct("<4sQ32s16s")
MAX_PAGE_BYTES = 64 << 20  # default bound of one page's payload: a bigger file is never read
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW
_PAGE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW


def _checksum(key_raw: bytes, data: bytes) -> bytes:
    h = hashlib.blake2b(key_raw, digest_size=16)
    h.update(data)
    return h.digest()


class FileStore:
    """One file per page under `directory/<key[:2]>/<key>.page`, written atomically with its key and
    a checksum. A page holds at most `max_page_bytes` (put() refuses more, get() never reads a
    bigger file). stats(): `corrupt` counts damaged or unreadable pages (and anything at a page path
    that is not a regular file within that bound: a directory, FIFO, device, socket, symlink or an
    oversized file), `misplaced` valid pages whose header names another key; all are misses. Safe to
    share between threads (an engine's storage threads do): writes are atomic renames, counters locked."""

    def __init__(
        self, directory: str | os.PathLike[str], *, fsync: bool = True, max_page_bytes: int = MAX_PAGE_BYTES
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise ValueError(f"FileStore directory must be a path, got {type(directory).__name__}")
        if isinstance(max_page_bytes, bool) or not isinstance(max_page_bytes, int) or max_page_bytes < 1:
            raise ValueError(f"max_page_bytes must be an integer >= 1, got {max_page_bytes!r}")
        self.max_page_bytes = max_page_bytes
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"FileStore directory {str(self.directory)!r} exists and is not a directory")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.corrupt = 0
        self.misplaced = 0
        self.writes = 0

    def path_for(self, key: str) -> Path:
        """Where the page for `key` lives (tests corrupt it on purpose)."""
        check_key(key)
        return self.directory / key[:2] / f"{key}.page"

    def _load(self, key: str) -> bytes | None:
        """The verified page, or None; a corrupt, truncated or misplaced file is counted and dropped.
        Anything that is not a regular page file of at most max_page_bytes (a FIFO, device, socket,
        symlink, directory, an oversized or sparse file) is a counted miss, never read, left alone."""
        path = self.path_for(key)
        raw = self._read_page_file(path)
        if raw is None:
            return None
        if len(raw) >= _HEADER.size:
            magic, length, key_raw, digest = _HEADER.unpack_from(raw)
            data = raw[_HEADER.size :]
            if magic == _MAGIC and length == len(data) and _checksum(key_raw, data) == digest:
                if key_raw == bytes.fromhex(key):
                    return data
                self._bump("misplaced")  # a valid page of another key: never served under this one
                self._drop(path)
                return None
        # Corrupt or truncated: never returned; drop the file so the next write repairs it.
        self._bump("corrupt")
        self._drop(path)
        return None

    def _bump(self, counter: str) -> None:
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def _open_page(self, path: Path) -> tuple[int, os.stat_result] | None:
        """An open descriptor of the regular file at `path` within the page bound (no symlink
        followed, the fan-out directory included) and its stat, or None: missing (a plain miss) or
        refused before reading (counted corrupt). The caller closes the descriptor."""
        try:
            dfd = os.open(path.parent, _DIR_FLAGS)
        except FileNotFoundError:
            return None
        except OSError:  # a file or a symlink where the fan-out directory should be
            self._bump("corrupt")
            return None
        try:
            fd = os.open(path.name, _PAGE_FLAGS, dir_fd=dfd)  # O_NONBLOCK: a FIFO cannot hang the open
        except FileNotFoundError:
            return None
        except OSError:  # ELOOP (a symlink), EISDIR, ENXIO, EACCES...: not a page file we can read
            self._bump("corrupt")
            return None
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _HEADER.size + self.max_page_bytes:
            os.close(fd)
            self._bump("corrupt")  # a FIFO, device, socket or directory; or bigger than any page
            return None
        return fd, st

    def _read_page_file(self, path: Path) -> bytes | None:
        """The bytes of the page file at `path` (see _open_page), bounded even if it grew meanwhile."""
        opened = self._open_page(path)
        if opened is None:
            return None
        fd, _ = opened
        try:
            with os.fdopen(fd, "rb", closefd=False) as fh:
                raw = fh.read(_HEADER.size + self.max_page_bytes + 1)
        except OSError:
            self._bump("corrupt")
            return None
        finally:
            os.close(fd)
        if len(raw) > _HEADER.size + self.max_page_bytes:
            self._bump("corrupt")
            return None
        return raw

    def present(self, key: str) -> bool:
        """A cheap `contains`: the page file is there, its header names `key` and its length fits
        the file; the payload is not read (get() verifies the checksum). A short file or a header
        of another key is counted and dropped, as get() would."""
        path = self.path_for(key)
        opened = self._open_page(path)
        if opened is None:
            return False
        fd, st = opened
        try:
            head = os.read(fd, _HEADER.size)
        except OSError:
            self._bump("corrupt")
            return False
        finally:
            os.close(fd)
        if len(head) == _HEADER.size:
            magic, length, key_raw, _ = _HEADER.unpack(head)
            if magic == _MAGIC and st.st_size == _HEADER.size + length:
                if key_raw == bytes.fromhex(key):
                    return True
                self._bump("misplaced")
                self._drop(path)
                return False
        self._bump("corrupt")
        self._drop(path)
        return False

    @staticmethod
    def _drop(path: Path) -> None:
        try:
            path.unlink()
        except FileNotFoundError:  # pragma: no cover - raced with another remover
            pass

    def get(self, key: str) -> bytes | None:
        data = self._load(key)
        self._bump("misses" if data is None else "hits")
        return data

    def put(self, key: str, data: bytes) -> None:
        path = self.path_for(key)
        data = _check_data(data)
        if len(data) > self.max_page_bytes:
            raise ValueError(f"FileStore: a page of {len(data)} bytes exceeds max_page_bytes ({self.max_page_bytes})")
        if path.is_dir() or path.parent.is_symlink() or path.parent.exists() and not path.parent.is_dir():
            raise ValueError(f"FileStore: {str(path)!r} is in the way and is not a page file")
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                key_raw = bytes.fromhex(key)
                fh.write(_HEADER.pack(_MAGIC, len(data), key_raw, _checksum(key_raw, data)))
                fh.write(data)
                fh.flush()
                if self.fsync:
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        if self.fsync:
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self._bump("writes")

    def contains(self, key: str) -> bool:
        """True only for a page that verifies (pages are small): a corrupt one is never counted."""
        return self._load(key) is not None

    def delete(self, key: str) -> bool:
        """Remove one page file; False if none was there (a directory in the way is not a page)."""
        try:
            self.path_for(key).unlink()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        return True

    def keys(self) -> list[str]:
        """Stored keys (sorted): names of page files, not verified (get() verifies)."""
        return sorted(p.stem for p in self.directory.glob("??/*.page") if p.is_file() and not p.is_symlink())

    def stats(self) -> dict[str, int]:
        pages = len(self.keys())
        with self._lock:
            return {
                "pages": pages,
                "hits": self.hits,
                "misses": self.misses,
                "corrupt": self.corrupt,
                "misplaced": self.misplaced,
                "writes": self.writes,
            }
