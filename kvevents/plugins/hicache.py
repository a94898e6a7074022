"""kvevents' page store as an SGLang HiCache storage ("L3") backend (SGLang >= 0.5.20).

Loaded by SGLang's own dynamic backend loading, no patch of SGLang::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name": "kvevents", "module_path": "kvevents.plugins.hicache",
      "class_name": "KVEventsHiCacheStorage", "path": "/var/lib/kvevents/hicache"}'

SGLang's factory imports this module, takes the class by name, checks that it subclasses its
`HiCacheStorage` and builds it as `cls(storage_config, kwargs)`. Pages go to a
`hicache_store.HiCachePageStore` keyed by the storage keys SGLang gives (they carry the namespace),
scoped to this rank, each page's header bound to its key: a swapped, copied or corrupt file is a
counted miss, never served. `batch_exists` counts the consecutive prefix present. Both of SGLang's
page interfaces work: the generic one (tensors in and out) and, with `"interface_v1": 1`, the
host-pool one (`batch_get_v1` / `batch_set_v1`). Counters: `stats()`; Prometheus with
`"metrics_port"` (hicache_metrics.HICACHE_METRICS).

Importable without SGLang: the class is built on the first access of the module attribute
`KVEventsHiCacheStorage` (a PEP 562 module `__getattr__`, which is what SGLang's `getattr` does),
and only then are SGLang's `HiCacheStorage` and torch imported. The methods live in a plain mixin.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvevents.plugins.hicache_metrics import MetricsServer
from kvevents.plugins.hicache_store import HiCachePageStore, StorageScope

__all__ = [
    "BACKEND_NAME",
    "CLASS_NAME",
    "ENV_DIR",
    "BackendOptions",
    "backend_class",
    "backend_options",
    "extra_config",
]

log = logging.getLogger("kvevents.plugins.hicache")

BACKEND_NAME = "kvevents"
CLASS_NAME = "KVEventsHiCacheStorage"
ENV_DIR = "KVEVENTS_HICACHE_DIR"  # the store's root when the extra config has no "path"

#: Keys of the extra config this backend reads.
OWN_FIELDS = ("path", "fsync", "metrics_port", "metrics_addr")
#: Keys SGLang itself reads from the same JSON (passed on to every backend): accepted, not ours.
SGLANG_FIELDS = ("backend_name", "module_path", "class_name", "interface_v1", "allocator", "tp_lcm_size")


@dataclass(frozen=True)
class BackendOptions:
    """This backend's part of `--hicache-storage-backend-extra-config`."""

    path: Path
    fsync: bool = True
    metrics_port: int | None = None  # offset by the rank index; 0: a free port per rank
    metrics_addr: str = "127.0.0.1"


def backend_options(extra: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> BackendOptions:
    """Parse the extra config (ValueError names the bad field; unknown fields are logged once)."""
    extra = dict(extra or {})
    env = os.environ if env is None else env
    unknown = sorted(set(extra) - set(OWN_FIELDS) - set(SGLANG_FIELDS))
    if unknown:
        log.warning("kvevents HiCache backend: extra config fields not understood, ignored: %s", ", ".join(unknown))
    path = extra.get("path") or env.get(ENV_DIR)
    if not path or not isinstance(path, str):
        raise ValueError(
            f'the kvevents HiCache backend needs a directory: "path" in the extra config or {ENV_DIR} (got {path!r})'
        )
    fsync = extra.get("fsync", True)
    if not isinstance(fsync, bool):
        raise ValueError(f'"fsync" must be true or false, got {fsync!r}')
    port = extra.get("metrics_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise ValueError(f'"metrics_port" must be a port number 0..65535, got {port!r}')
    addr = extra.get("metrics_addr", "127.0.0.1")
    if not isinstance(addr, str) or not addr:
        raise ValueError(f'"metrics_addr" must be a host address, got {addr!r}')
    return BackendOptions(Path(path), fsync, port, addr)


def extra_config(path: str | os.PathLike[str], **fields: Any) -> dict[str, Any]:
    """The JSON object `--hicache-storage-backend-extra-config` takes to load this backend."""
    return {
        "backend_name": BACKEND_NAME,
        "module_path": __name__,
        "class_name": CLASS_NAME,
        "path": str(path),
        **fields,
    }


# ---------------------------------------------------------------- tensors <-> page bytes (torch, lazily)


def _page_bytes(value: Any) -> memoryview:
    """A tensor's bytes (copied to host memory first if it lives on a device)."""
    import torch

    t = value.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _read_into(store: HiCachePageStore, key: str, target: Any) -> bool:
    """Fill `target` (a tensor of one page) from the store; False, `target` untouched, on a miss."""
    import torch

    nbytes = target.numel() * target.element_size()
    if target.device.type == "cpu" and target.is_contiguous():
        return store.get_into(key, memoryview(target.reshape(-1).view(torch.uint8).numpy()))
    data = store.get_sized(key, nbytes)
    if data is None:
        return False
    page = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(target.dtype).reshape(target.shape)
    target.copy_(page)
    return True


def _new_page(data: bytes) -> Any:
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


# ---------------------------------------------------------------- the backend's methods (no SGLang import)


class HiCacheMethods:
    """SGLang's HiCacheStorage interface over a HiCachePageStore; mixed into SGLang's base class by
    `backend_class()`. `register_mem_pool_host` (SGLang's own) sets `mem_pool_host` for the v1 calls."""

    mem_pool_host: Any

    def __init__(self, storage_config: Any, kwargs: Mapping[str, Any] | None = None) -> None:
        self.options = backend_options(getattr(storage_config, "extra_config", None))
        self.scope = StorageScope.from_config(storage_config)
        self.store = HiCachePageStore(self.options.path, self.scope, fsync=self.options.fsync)
        self.metrics: MetricsServer | None = None
        self._close_lock = threading.Lock()
        if self.options.metrics_port is not None:
            port = self.options.metrics_port and self.options.metrics_port + self.scope.rank_index
            labels = {"scope": self.scope.dirname()}
            self.metrics = MetricsServer(self.store.stats, port, addr=self.options.metrics_addr, labels=labels)
        log.info(
            "kvevents HiCache backend: pages in %s%s",
            self.store.directory,
            f", metrics on {self.options.metrics_addr}:{self.metrics.port}" if self.metrics else "",
        )

    # -- generic interface: tensors in, tensors out
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        """The page into `target_location` (returned), a new uint8 tensor without one, or None."""
        if target_location is None:
            data = self.store.get(key)
            return None if data is None else _new_page(data)
        return target_location if _read_into(self.store, key, target_location) else None

    def batch_get(self, keys: Sequence[str], target_locations: Any = None, target_sizes: Any = None) -> list[Any]:
        targets = target_locations if target_locations is not None else [None] * len(keys)
        return [self.get(key, target) for key, target in zip(keys, targets)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        if value is None:
            log.warning("kvevents HiCache backend: set(%r) without a value, not stored", key)
            return False
        return self.store.put(key, _page_bytes(value))

    def batch_set(
        self, keys: Sequence[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None
    ) -> bool:
        """True if every page was stored; stops at the first that was not (SGLang retries the batch)."""
        if values is None or len(values) != len(keys):
            return False
        return all(self.set(key, value) for key, value in zip(keys, values))

    def exists(self, key: str) -> bool:
        return self.store.exists(key)

    def batch_exists(self, keys: Sequence[str], extra_info: Any = None) -> int:
        """The number of consecutive pages present from the first: what SGLang may prefetch."""
        return self.store.batch_exists(keys)

    # -- "interface_v1": pages straight from and into the host pool at host_indices
    def batch_get_v1(self, keys: Sequence[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        pool = self.mem_pool_host
        step = pool.page_size
        out = []
        for i, key in enumerate(keys):
            page = pool.get_dummy_flat_data_page()
            ok = _read_into(self.store, key, page)
            if ok:
                pool.set_from_flat_data_page(int(host_indices[i * step]), page)
            out.append(ok)
        return out

    def batch_set_v1(self, keys: Sequence[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        pool = self.mem_pool_host
        step = pool.page_size
        return [self.set(key, pool.get_data_page(int(host_indices[i * step]), flat=True)) for i, key in enumerate(keys)]

    # -- lifecycle and counters
    def clear(self) -> bool:
        """Remove this rank's pages (SGLang's clear-storage admin call)."""
        removed = self.store.clear()
        log.info("kvevents HiCache backend: cleared %d pages from %s", removed, self.store.directory)
        return True

    def stats(self) -> dict[str, int]:
        """The store's counters: pages, hits, misses, corrupt, misplaced, writes, ..."""
        return self.store.stats()

    def get_stats(self) -> None:
        """SGLang's StorageMetrics (prefetch / backup histograms): not measured here; see stats()."""
        return None

    def close(self) -> None:
        """Stop the metrics server (SGLang calls this when it detaches the backend)."""
        with self._close_lock:
            server, self.metrics = self.metrics, None
        if server is not None:
            server.close()


_built: dict[str, type] = {}
_build_lock = threading.Lock()


def backend_class() -> type:
    """The HiCacheStorage subclass SGLang loads (built once; ImportError without SGLang)."""
    with _build_lock:
        cls = _built.get(CLASS_NAME)
        if cls is None:
            from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

            doc = "kvevents' page store as SGLang's HiCache storage backend (see kvevents.plugins.hicache)."
            meta = type(HiCacheStorage)  # ABCMeta: the abstract methods are checked against the mixin's
            cls = meta(CLASS_NAME, (HiCacheMethods, HiCacheStorage), {"__module__": __name__, "__doc__": doc})
            _built[CLASS_NAME] = cls
        return cls


def __getattr__(name: str) -> Any:
    """PEP 562: `KVEventsHiCacheStorage` is built (importing SGLang) when first asked for."""
    if name == CLASS_NAME:
        return backend_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
