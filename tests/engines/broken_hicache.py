"""HiCache backends with the bugs `kvevents conformance storage` must catch (SGLang venv only).

`ClaimsEverything` answers every key (exists and get), serving zeros for pages it never stored: a
backend that cannot tell namespaces (or keys) apart. `ForgetsWrites` acknowledges writes and
keeps nothing. Both subclass SGLang's own HiCacheStorage, so its factory loads them.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


class ClaimsEverything(HiCacheStorage):
    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        self.pages: dict[str, Any] = {}

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        page = self.pages.get(key)
        if page is None:
            target_location.zero_()
        else:
            target_location.copy_(page)
        return target_location

    def batch_get(self, keys: Any, target_locations: Any = None, target_sizes: Any = None) -> Any:
        return [self.get(k, t) for k, t in zip(keys, target_locations)]

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        self.pages[key] = value.clone()
        return True

    def batch_set(self, keys: Any, values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        return all(self.set(k, v) for k, v in zip(keys, values))

    def exists(self, key: str) -> bool:
        return True


class ForgetsWrites(ClaimsEverything):
    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return True

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        return None

    def exists(self, key: str) -> bool:
        return False
