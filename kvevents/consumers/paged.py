"""zeros_paged: np.zeros for the index's big arrays, on 2 MiB boundaries with transparent huge pages.

Shared by the HashTable's slot arrays (kvevents.consumers.table) and its holder pool
(kvevents.consumers.holders); `is_paged` tells which arrays live in these mappings (tracemalloc does
not see them, so the index reports their bytes itself).
"""

from __future__ import annotations

import math
import mmap

import numpy as np

__all__ = ["zeros_paged", "is_paged"]

_HUGE = 1 << 21  # a transparent huge page (x86-64, most arm64 kernels)
_MAP_PRIVATE_ANON = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
_CAN_HUGE = bool(getattr(mmap, "MAP_ANONYMOUS", 0)) and hasattr(mmap, "MADV_HUGEPAGE")


def zeros_paged(shape: int | tuple[int, ...], dtype: type) -> np.ndarray:
    """np.zeros, but an array of 2 MiB or more starts on a huge-page boundary and asks the kernel for
    transparent huge pages (madvise): a lookup's random probes then miss the TLB far less (its keys
    and rows span megabytes; with 4 KiB pages each probe is a page walk, costly under a hypervisor).
    Where the platform has no such mmap, or the kernel says no, it is plain np.zeros."""
    dt = np.dtype(dtype)
    count = math.prod(shape) if isinstance(shape, tuple) else shape
    nbytes = count * dt.itemsize
    if not _CAN_HUGE or nbytes < _HUGE:
        return np.zeros(shape, dt)
    try:
        region = mmap.mmap(-1, nbytes + _HUGE, flags=_MAP_PRIVATE_ANON)  # anonymous: zero-filled
        region.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError):
        return np.zeros(shape, dt)
    raw = np.frombuffer(region, np.uint8)  # keeps `region` mapped while any view of it lives
    start = -raw.ctypes.data % _HUGE
    return raw[start : start + nbytes].view(dt).reshape(shape)


def is_paged(a: np.ndarray) -> bool:
    """True if `a` lives in one of zeros_paged's own mappings (outside the Python allocator)."""
    base = a.base
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)
