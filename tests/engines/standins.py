"""Stand-ins for engine imports that cannot run on a CPU machine, for the engine drivers only.

Each stand-in is named by a constant the tests report, and is installed only inside an engine
test venv (tests/engines/*_driver.py): never by kvevents itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Sequence

TORCHVISION = (
    "torchvision: stub modules (the only torchvision wheels in reach are CUDA-linked and fail to load "
    "beside CPU torch; SGLang imports it at module level, nothing on the KV-cache paths calls it)"
)


class _Unavailable:
    """Whatever a stubbed module is asked for: fails loudly if anything actually uses it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is a test stand-in (torchvision cannot load on this CPU machine)")

    def __getattr__(self, attr: str) -> _Unavailable:
        return _Unavailable(f"{self._name}.{attr}")

    def __mro_entries__(self, bases: Sequence[Any]) -> tuple[type, ...]:
        return (object,)  # `class X(torchvision.Foo)` at import time still defines X


def _module_getattr(name: str) -> Any:
    def getattr_(attr: str) -> _Unavailable:
        if attr.startswith("__"):  # module protocol lookups (__file__, __version__...): absent
            raise AttributeError(attr)
        return _Unavailable(f"{name}.{attr}")

    return getattr_


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == self.root or fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = types.ModuleType(spec.name)
        mod.__path__ = []  # a package: submodules resolve through this finder too
        mod.__getattr__ = _module_getattr(spec.name)  # type: ignore[method-assign]
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def stub_torchvision() -> str:
    """Serve `torchvision.*` with stubs; first pin transformers' cached answer to "not available"."""
    try:
        from transformers.utils import import_utils

        assert not import_utils.is_torchvision_available()  # computed (and cached) before the stub exists
    except ImportError:
        pass
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder("torchvision"))
    return TORCHVISION


HICACHE_HOST_REGISTER = (
    "sglang.srt.mem_cache.pool_host.common.ALLOC_MEMORY_FUNCS['cpu']: a plain allocation (SGLang's "
    "host KV pool registers its memory with cudaHostRegister, CUDA only)"
)
HICACHE_TRANSFER = (
    "sglang.srt.mem_cache.pool_host.mha.transfer_kv_direct: a torch index copy per layer (SGLang takes "
    "its device<->host page copy from sgl_kernel, built for CUDA only)"
)
HICACHE_PIN_MEMORY = (
    "MHATokenToKVPoolHost.pin_memory = False once built (pinned host tensors need a CUDA device; the "
    "host pool's get_dummy_flat_data_page asks for them)"
)
HICACHE = (HICACHE_HOST_REGISTER, HICACHE_TRANSFER, HICACHE_PIN_MEMORY)


def _transfer_kv_direct(src_layers: Any, dst_layers: Any, src_indices: Any, dst_indices: Any, page_size: int) -> None:
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]


def stand_in_hicache_cpu() -> list[str]:
    """The three CUDA-only spots of SGLang 0.5.20's HiCache host tier, replaced for a CPU run
    (../shared/ENGINES.md); returns their names. Call after stub_torchvision()."""
    from sglang.srt.mem_cache.pool_host import common, mha

    def alloc(dims: Any, dtype: Any, device: Any, pin_memory: bool, allocator: Any, **_: Any) -> Any:
        return allocator.allocate(dims, dtype=dtype, device=device)

    common.ALLOC_MEMORY_FUNCS["cpu"] = alloc
    mha.transfer_kv_direct = _transfer_kv_direct
    host = mha.MHATokenToKVPoolHost
    if not getattr(host.__init__, "_kvevents_stand_in", False):
        built = host.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            built(self, *args, **kwargs)
            self.pin_memory = False

        init._kvevents_stand_in = True  # type: ignore[attr-defined]
        host.__init__ = init  # type: ignore[method-assign]
    return list(HICACHE)
