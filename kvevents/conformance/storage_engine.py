"""SGLang's own HiRadixCache and HiCacheController on one rank, driven the way its scheduler drives
them, for `kvevents conformance storage` (kvevents/conformance/storage.py).

No model and no weights: a local `config.json` names a tiny Llama, and where a forward pass would
write the KV pool, each page gets made-up values drawn from its storage key (as a real model's
are a function of the page's tokens and namespace), and SGLang's own code moves pages device ->
host -> storage backend -> (evicted) -> storage prefetch -> host -> device. The backend is loaded by
SGLang's factory through `--hicache-storage-backend dynamic`. A single-process gloo setup of SGLang's
own parallel_state stands for the TP group. SGLang is imported only here, inside functions.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvevents.errors import KVEventsError
from kvevents.hashing import Namespace, event_hashes, storage_hashes, to_int64

__all__ = ["EngineSpec", "EngineUnavailable", "HiCacheEngine", "Request", "Served", "sglang_missing"]

_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
}


class EngineUnavailable(KVEventsError):
    """SGLang is missing, or its HiRadixCache cannot be built in this environment."""


def sglang_missing() -> str | None:
    """None when SGLang can be imported here, else why not (one line)."""
    try:
        import sglang.srt.mem_cache.hiradix_cache  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: not here
        return f"{type(exc).__name__}: {exc}"
    return None


@dataclass(frozen=True)
class EngineSpec:
    """One rank: the backend SGLang loads (module, class, extra config) and a small KV geometry."""

    backend_module: str
    backend_class: str
    backend_config: Mapping[str, Any] = field(default_factory=dict)
    page_size: int = 16
    device_pages: int = 48
    layers: int = 2
    head_dim: int = 8
    device: str | None = None  # None: "cuda" when torch has it, else "cpu"
    timeout_s: float = 20.0

    def extra_config(self) -> dict[str, Any]:
        """The JSON of `--hicache-storage-backend-extra-config`: the backend by module and class."""
        name = str(self.backend_config.get("backend_name", self.backend_class))
        base = {"backend_name": name, "module_path": self.backend_module, "class_name": self.backend_class}
        return {"prefetch_threshold": self.page_size, **dict(self.backend_config), **base}


@dataclass(frozen=True)
class Request:
    tokens: list[int]
    extra_key: str | None = None
    cache_salt: str | None = None

    @property
    def namespace(self) -> Namespace:
        return Namespace(self.extra_key, self.cache_salt)


@dataclass
class Served:
    """What one request found and did (tokens), and the KV contents it ended with (bytes)."""

    storage_query: int  # tokens SGLang's storage hit query found before the prefetch
    from_storage: int  # tokens the prefetch loaded from the backend
    from_host: int  # tokens loaded back from host memory
    on_device: int  # tokens already on the device
    computed: int  # tokens the "forward pass" wrote
    contents: bytes = b""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init_parallel_state() -> Any:
    """SGLang's parallel_state for one process over gloo (kept if the process has one already)."""
    import torch
    from sglang.srt.distributed import parallel_state as ps

    if not torch.distributed.is_initialized():
        ps.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(backend="gloo")
    return ps.get_tp_group().cpu_group


class HiCacheEngine:
    """One HiRadixCache with storage, its pools, and request serving as SGLang's scheduler does it."""

    def __init__(self, spec: EngineSpec, workdir: str | Path) -> None:
        why = sglang_missing()
        if why is not None:
            raise EngineUnavailable(f"SGLang is needed to run the storage scenario ({why})")
        self.spec = spec
        self.page = spec.page_size
        try:
            self._build(Path(workdir))
        except Exception as exc:  # noqa: BLE001 - whatever SGLang raises while building, said in one line
            raise EngineUnavailable(f"SGLang's HiRadixCache cannot be built here: {type(exc).__name__}: {exc}") from exc

    def _build(self, workdir: Path) -> None:
        import torch
        from sglang.srt import runtime_context
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.server_args import ServerArgs

        spec = self.spec
        device = spec.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = workdir / "model"
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps(_MODEL))
        self.server_args = ServerArgs(
            model_path=str(model),
            served_model_name="kvevents-conformance",
            device=device,
            page_size=self.page,
            enable_hierarchical_cache=True,
            hicache_io_backend="direct",
            hicache_mem_layout="layer_first",
            hicache_write_policy="write_through",
            hicache_storage_prefetch_policy="wait_complete",
            hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps(spec.extra_config()),
        )
        runtime_context.publish(self.server_args, role="scheduler")
        group = _init_parallel_state()
        size = spec.device_pages * self.page
        dtype = torch.float16
        self.kv = MHATokenToKVPool(
            size=size,
            page_size=self.page,
            dtype=dtype,
            head_num=1,
            head_dim=spec.head_dim,
            layer_num=spec.layers,
            device=device,
            enable_memory_saver=False,
            enable_alt_stream=False,
        )
        self.alloc = PagedTokenToKVPoolAllocator(size, self.page, dtype, device, self.kv, False)
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=self.alloc,
            page_size=self.page,
            tp_cache_group=group,
            enable_kv_cache_events=True,
        )
        self.cache = HiRadixCache(params, self.server_args)
        self.backend = self.cache.cache_controller.storage_backend
        self.host = self.cache.token_to_kv_pool_host
        self._rid = 0

    # ---------------------------------------------------------------- the scheduler's part

    def settle(self, done: Callable[[], bool]) -> bool:
        """Run the scheduler's per-step hicache checks until `done()` (False at the deadline)."""
        deadline = time.monotonic() + self.spec.timeout_s
        while time.monotonic() < deadline:
            self.cache.check_hicache_events()
            if done():
                return True
            time.sleep(0.002)
        return False

    def idle(self) -> bool:
        """No write-through, storage backup or load-back in flight."""
        c = self.cache
        return not c.ongoing_write_through and not c.ongoing_backup and not c.ongoing_load_back

    def serve(self, req: Request) -> Served:
        """One request: match, storage hit query and prefetch, load back, compute the rest, insert,
        write through to host and storage (waited for); returns what it found and its KV contents."""
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle, MatchPrefixParams

        self._rid += 1
        key = self._key(req)
        m = self.cache.match_prefix(MatchPrefixParams(key=key))
        matched = len(m.device_indices) + m.host_hit_length
        node = m.last_host_node
        rest, last = req.tokens[matched:], node.get_last_hash_value()
        query = self.cache.query_storage_hit_length(
            node, rest, last, extra_key=req.extra_key, cache_salt=req.cache_salt
        )
        handle = CacheRequestHandle(f"kvevents-{self._rid}", 0)
        self.cache.prefetch_from_storage(handle, node, rest, last, extra_key=req.extra_key, cache_salt=req.cache_salt)
        if not self.settle(lambda: self.cache.check_prefetch_progress(handle)):
            raise TimeoutError(f"the storage prefetch did not finish within {self.spec.timeout_s} s")
        loaded = self.cache.pop_prefetch_loaded_tokens(handle)
        return self._finish(req, query, loaded)

    def _finish(self, req: Request, query: int, loaded: int) -> Served:
        import torch
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, InsertParams, MatchPrefixParams

        key = self._key(req)
        m = self.cache.match_prefix(MatchPrefixParams(key=key))
        indices, on_device, from_host = m.device_indices.to(torch.int64), len(m.device_indices), 0
        if m.host_hit_length:
            params = InitLoadBackParams(best_match_node=m.best_match_node, host_hit_length=m.host_hit_length)
            values, _ = self.cache.init_load_back(params)
            self.cache.ready_to_load_host_cache()
            from_host = len(values)
            indices = torch.cat([indices, values.to(torch.int64)])
        need = len(req.tokens) // self.page * self.page - len(indices)
        if need > 0:
            new = self.alloc.alloc(need)
            if new is None:
                raise RuntimeError(f"the device pool has no room for {need} tokens")
            new = new.to(torch.int64)
            self._forward(req, len(indices), new)
            indices = torch.cat([indices, new])
            self.cache.insert(InsertParams(key=key, value=indices))
        if not self.settle(self.idle):
            raise TimeoutError(f"write-through / load-back did not finish within {self.spec.timeout_s} s")
        return Served(query, loaded, from_host, on_device, max(need, 0), self.contents(indices))

    def _forward(self, req: Request, start: int, slots: Any) -> None:
        """Write made-up K and V values for tokens start.. into `slots`, each page's drawn from its
        storage key: the same page always gets the same values, different namespaces different ones."""
        import torch

        keys = storage_hashes(req.tokens, self.page, req.namespace)
        for i, first in enumerate(range(start, start + len(slots), self.page)):
            gen = torch.Generator().manual_seed(int(keys[first // self.page][:15], 16))
            page = slots[i * self.page : (i + 1) * self.page]
            for layer in range(self.spec.layers):
                for buf in (self.kv.k_buffer[layer], self.kv.v_buffer[layer]):
                    values = torch.randn(len(page), 1, self.spec.head_dim, generator=gen).to(buf.dtype)
                    buf[page] = values.to(buf.device)

    def _key(self, req: Request) -> Any:
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(list(req.tokens), req.extra_key, cache_salt=req.cache_salt)

    def contents(self, indices: Any) -> bytes:
        """The K and V values of every layer at these device slots, as bytes in token order (page i
        is the i-th `page_bytes()` slice)."""
        import torch

        kv = [
            torch.stack([self.kv.k_buffer[i][indices], self.kv.v_buffer[i][indices]]) for i in range(self.spec.layers)
        ]
        by_token = torch.stack(kv).permute(2, 0, 1, 3, 4)  # [token, layer, k|v, head, dim]
        return by_token.cpu().contiguous().view(torch.uint8).numpy().tobytes()

    def page_bytes(self) -> int:
        """Bytes of one page in `contents()`."""
        return self.page * self.spec.layers * 2 * self.spec.head_dim * 2  # one head, float16

    def flush(self) -> None:
        """Evict everything from the device, then from host memory (storage keeps its pages)."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        everything = self.spec.device_pages * self.page * 4
        self.cache.evict(EvictParams(num_tokens=everything))
        self.cache.evict_host(everything)

    def only_storage_left(self) -> str:
        """'' when device and host hold nothing (the tree is empty, both pools whole), else what is left."""
        left = []
        if self.cache.root_node.children:
            left.append(f"{len(self.cache.root_node.children)} tree nodes")
        if self.alloc.available_size() != self.spec.device_pages * self.page:
            left.append(f"device {self.alloc.available_size()} of {self.spec.device_pages * self.page} free")
        if self.host.available_size() != self.host.size:
            left.append(f"host {self.host.available_size()} of {self.host.size} free")
        return "; ".join(left)

    def take_events(self) -> list[Any]:
        return list(self.cache.take_events())

    def tree_truth(self) -> Counter[tuple[str, int]]:
        """(medium, published hash) copies the tree holds: device pages as GPU, host pages as
        CPU_PINNED, hashed from each node's path by the contract (never from what was published)."""
        out: Counter[tuple[str, int]] = Counter()
        stack: list[tuple[Any, str | None]] = [(child, None) for child in self.cache.root_node.children.values()]
        while stack:
            node, prior = stack.pop()
            ns = Namespace(node.key.extra_key, node.key.cache_salt)
            hexes = event_hashes(list(node.key.token_ids[: len(node.key)]), self.page, ns, prior)
            for medium, present in (("GPU", node.value is not None), ("CPU_PINNED", node.host_value is not None)):
                if present:
                    out.update((medium, to_int64(h)) for h in hexes)
            last = hexes[-1] if hexes else prior
            stack.extend((c, last) for c in node.children.values())
        return out

    def servable_pages(self, req: Request) -> int:
        """Pages of `req` the engine holds on device or host for its namespace (a match, as the
        scheduler's; it may split a node but changes nothing else)."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        m = self.cache.match_prefix(MatchPrefixParams(key=self._key(req)))
        return (len(m.device_indices) + m.host_hit_length) // self.page

    def close(self) -> None:
        """Detach the backend (SGLang's own shutdown: stops its storage threads, closes the backend)."""
        self.cache.shutdown()
