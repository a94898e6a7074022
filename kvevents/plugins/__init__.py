"""kvevents inside engines: plug-ins an engine loads through its own entry-point group, and storage
backends it loads by module and class name.

`PLUGINS` maps each engine to the module holding its plug-in and the entry-point group that engine
reads (declared in pyproject.toml). `STORAGE_BACKENDS` maps each engine to the storage backend it can
load by name (SGLang's `--hicache-storage-backend dynamic`, no entry point). A plug-in module imports
nothing of its engine at module import time: kvevents stays importable without any engine installed.


| file | what it owns |
|---|---|
| `hicache.py` | kvevents' page store as an SGLang HiCache storage ("L3") backend (SGLang >= 0.5.20). |
| `hicache_metrics.py` | Prometheus metrics of the HiCache page store: names defined once here, read from `stats()` at scrape. |
| `hicache_store.py` | The page store under kvevents' SGLang HiCache backend: one engine rank's L3 pages, no SGLang needed. |
| `sglang.py` | kvevents' Publisher as SGLang's KV-event publisher "kvevents" (SGLang >= 0.5.20 plug-in). |
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PLUGINS", "STORAGE_BACKENDS", "EnginePlugin", "StorageBackend"]


@dataclass(frozen=True)
class EnginePlugin:
    """One engine's plug-in: its module, the engine's entry-point group, and the entry's name."""

    module: str
    group: str
    name: str
    entry: str  # "module:function" as pyproject declares it


@dataclass(frozen=True)
class StorageBackend:
    """One engine's storage backend: the module and class the engine loads, the name it is known by."""

    module: str
    class_name: str
    backend_name: str
    flag: str  # how the engine is told to load it


PLUGINS: dict[str, EnginePlugin] = {
    "sglang": EnginePlugin(
        module="kvevents.plugins.sglang",
        group="sglang.srt.plugins",
        name="kvevents",
        entry="kvevents.plugins.sglang:register",
    ),
}

STORAGE_BACKENDS: dict[str, StorageBackend] = {
    "sglang": StorageBackend(
        module="kvevents.plugins.hicache",
        class_name="KVEventsHiCacheStorage",
        backend_name="kvevents",
        flag="--hicache-storage-backend dynamic --hicache-storage-backend-extra-config JSON",
    ),
}
