"""The page store under kvevents' SGLang HiCache backend: one engine rank's L3 pages, no SGLang needed.

SGLang names each page by its storage key: the contract's storage chain, which carries the whole
namespace (schemas/README.md, "Storage hashes (full namespace)"), so pages of different adapters or
tenants never share a key. A key says nothing of the model or the rank, though: two TP ranks hold
different heads under one key. `StorageScope` is that part (model, TP/PP/CP rank, layout); every page
lives in its scope's directory, in a `FileStore` under a file key derived from (scope, storage key),
so the page header binds both: a file swapped with another key's, or copied in from another rank or
model, is a counted miss, never served; so is a corrupt or truncated one. Safe to share between the
engine's storage threads.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvevents.cache.store import FileStore

__all__ = ["StorageScope", "HiCachePageStore", "STORE_COUNTERS"]

log = logging.getLogger("kvevents.plugins.hicache")

_FILE_KEY_PREFIX = b"kvevents-hicache-page-v1\x00"
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")

#: Counters of HiCachePageStore.stats() besides the FileStore's own (pages, corrupt, misplaced,
#: writes). hits and misses are counted here: a page of the wrong size is a miss, not a hit.
STORE_COUNTERS = (
    "hits",
    "misses",
    "size_mismatch",
    "write_skipped",
    "write_errors",
    "read_errors",
    "bad_keys",
    "exists_hits",
    "exists_misses",
)


def _rank_pair(rank: Any, size: Any, what: str) -> tuple[int, int]:
    for v in (rank, size):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{what} rank and size must be integers, got {rank!r} of {size!r}")
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"{what} rank {rank} is not within a size of {size}")
    return rank, size


@dataclass(frozen=True)
class StorageScope:
    """What a storage key leaves out and a page's bytes depend on: the model, this rank's share of
    each page (TP, PP and attention-CP rank; none for rank-replicated MLA pages) and the layout."""

    model: str = ""
    tp: tuple[int, int] = (0, 1)
    pp: tuple[int, int] = (0, 1)
    cp: tuple[int, int] = (0, 1)
    rank_replicated: bool = False
    page_first: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise ValueError(f"model name must be a string, got {self.model!r}")
        for what in ("tp", "pp", "cp"):
            rank, size = getattr(self, what)
            _rank_pair(rank, size, what)

    @classmethod
    def from_config(cls, config: Any) -> StorageScope:
        """From SGLang's HiCacheStorageConfig (read by attribute; nothing of SGLang imported)."""
        return cls(
            model=getattr(config, "model_name", None) or "",
            tp=_rank_pair(config.tp_rank, config.tp_size, "tp"),
            pp=_rank_pair(getattr(config, "pp_rank", 0), getattr(config, "pp_size", 1), "pp"),
            cp=_rank_pair(getattr(config, "attn_cp_rank", 0), getattr(config, "attn_cp_size", 1), "attention cp"),
            rank_replicated=bool(getattr(config, "is_mla_model", False)),
            page_first=bool(getattr(config, "is_page_first_layout", False)),
        )

    @property
    def label(self) -> str:
        """The canonical text bound into every file key of this scope."""
        tp = "*" if self.rank_replicated else f"{self.tp[0]}/{self.tp[1]}"
        layout = "page_first" if self.page_first else "other"
        return f"model={self.model};tp={tp};pp={self.pp[0]}/{self.pp[1]};cp={self.cp[0]}/{self.cp[1]};layout={layout}"

    @property
    def rank_index(self) -> int:
        """This rank's place among all ranks of the engine (offsets a metrics port)."""
        return (self.pp[0] * self.tp[1] + self.tp[0]) * self.cp[1] + self.cp[0]

    def dirname(self) -> str:
        """A readable directory name, unique per label: `<model slug>.<tp part>.<digest of label>`."""
        slug = _SLUG.sub("-", self.model).strip("-.")[:64] or "model"
        tp = "tp-all" if self.rank_replicated else f"tp{self.tp[0]}of{self.tp[1]}"
        return f"{slug}.{tp}.{hashlib.sha256(self.label.encode()).hexdigest()[:12]}"


class HiCachePageStore:
    """One rank's pages by SGLang storage key: `put` / `get` / `get_into` bytes, `batch_exists` the
    consecutive prefix present, `stats()` counters (hits, misses, corrupt pages, ...).

    A key that is not a non-empty string, like a page that cannot be read, is a counted miss or a
    refused write (False): the engine's storage threads are never sent an exception.
    """

    def __init__(self, root: str | os.PathLike[str], scope: StorageScope, *, fsync: bool = True) -> None:
        if not isinstance(scope, StorageScope):
            raise ValueError(f"scope must be a StorageScope, got {type(scope).__name__}")
        self.scope = scope
        self.root = Path(root)
        self.files = FileStore(self.root / scope.dirname(), fsync=fsync)
        self._prefix = _FILE_KEY_PREFIX + scope.label.encode() + b"\x00"
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(STORE_COUNTERS, 0)

    @property
    def directory(self) -> Path:
        return self.files.directory

    def _bump(self, counter: str, n: int = 1) -> None:
        with self._lock:
            self._counts[counter] += n

    def file_key(self, key: str) -> str | None:
        """The FileStore key of storage key `key` in this scope (None, counted, for a bad key)."""
        if not isinstance(key, str) or not key:
            self._bump("bad_keys")
            log.warning("HiCache storage key must be a non-empty string, got %r: treated as a miss", key)
            return None
        return hashlib.sha256(self._prefix + key.encode("utf-8", "surrogatepass")).hexdigest()

    def path_for(self, key: str) -> Path:
        """Where the page of `key` lives (tests damage it on purpose)."""
        fk = self.file_key(key)
        if fk is None:
            raise ValueError(f"not a storage key: {key!r}")
        return self.files.path_for(fk)

    def exists(self, key: str) -> bool:
        """A page for `key` is there (its header checked, not its checksum: get() verifies that)."""
        fk = self.file_key(key)
        if fk is None:
            return False
        try:
            return self.files.present(fk)
        except OSError as exc:
            self._read_error(key, exc)
            return False

    def batch_exists(self, keys: Sequence[str]) -> int:
        """How many of `keys`, from the first, are present: SGLang prefetches that prefix."""
        found = 0
        for key in keys:
            if not self.exists(key):
                self._bump("exists_misses")
                break
            found += 1
        self._bump("exists_hits", found)
        return found

    def _fetch(self, key: str) -> bytes | None:
        fk = self.file_key(key)
        if fk is None:
            return None
        try:
            return self.files.get(fk)
        except OSError as exc:
            self._read_error(key, exc)
            return None

    def get(self, key: str) -> bytes | None:
        """The page's bytes, verified against its key and checksum, or None (a counted miss)."""
        data = self._fetch(key)
        self._bump("misses" if data is None else "hits")
        return data

    def get_sized(self, key: str, nbytes: int) -> bytes | None:
        """`get`, but a page of another size (another geometry or dtype) is a counted miss."""
        data = self._fetch(key)
        if data is not None and len(data) != nbytes:
            self._bump("size_mismatch")
            log.warning(
                "HiCache page %s has %d bytes, the engine expects %d: treated as a miss", key, len(data), nbytes
            )
            data = None
        self._bump("misses" if data is None else "hits")
        return data

    def get_into(self, key: str, buffer: memoryview) -> bool:
        """Read the page into a writable buffer of exactly its size; False (nothing written) on a miss."""
        view = memoryview(buffer).cast("B")
        data = self.get_sized(key, view.nbytes)
        if data is None:
            return False
        view[:] = data
        return True

    def put(self, key: str, data: bytes | bytearray | memoryview) -> bool:
        """Store one page; a page already there under this key is kept (pages are content-addressed:
        one key, one content). False, counted, when the page cannot be written."""
        fk = self.file_key(key)
        if fk is None:
            return False
        try:
            if self.files.present(fk):
                self._bump("write_skipped")
                return True
            self.files.put(fk, bytes(data))
            return True
        except (OSError, ValueError) as exc:
            self._bump("write_errors")
            log.warning("HiCache page %s could not be written: %s", key, exc)
            return False

    def delete(self, key: str) -> bool:
        fk = self.file_key(key)
        return fk is not None and self.files.delete(fk)

    def clear(self) -> int:
        """Remove every page of this scope (other ranks' and models' directories are left alone)."""
        return sum(1 for fk in self.files.keys() if self.files.delete(fk))

    def stats(self) -> dict[str, int]:
        """FileStore counters (pages, corrupt, misplaced, writes) and STORE_COUNTERS."""
        out = self.files.stats()
        with self._lock:
            out.update(self._counts)
        return out

    def _read_error(self, key: str, exc: OSError) -> None:
        self._bump("read_errors")
        log.warning("HiCache page %s could not be read: %s", key, exc)
