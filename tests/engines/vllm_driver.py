"""vLLM 0.33.0's own code against kvevents, in one process inside the vLLM venv (no stand-ins).

Run by tests/engines/test_vllm_real.py as `python vllm_driver.py TMPDIR` (VLLM_TARGET_DEVICE=cpu);
prints one KVEVENTS-REPORT line. Real: KVCacheManager over its BlockPool (one full-attention group,
page 16, prefix caching and events on, sha256 block hashes), Request with its block hasher, LoRA
requests and cache salts; vLLM's ZmqEventPublisher (PUB + replay ROUTER) and its msgspec decoder.
The truth is read from the block pool: every cached block's hash (BlockPool.blocks).
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from itertools import count
from typing import Any

import msgspec
import torch
from engine_run import PER_STEP, STEPS, EngineSide, run_engine
from harness import Report
from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

from kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, Event

PAGE = 16
BLOCKS = 48  # small: requests evict
ADAPTERS = (None, LoRARequest("lora-a", 1, "/adapters/a"), LoRARequest("lora-b", 2, "/adapters/b"))
SALTS = (None, "tenant-1")
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)
_ids = count()


def signed(h: int) -> int:
    """vLLM's uint64 event hash as the int64 kvevents keeps (schemas/README.md, "The published integer")."""
    return h - (1 << 64) if h >= 1 << 63 else h


class VllmEngine:
    def __init__(self) -> None:
        init_none_hash(sha256)
        spec = FullAttentionSpec(block_size=PAGE, num_kv_heads=1, head_size=8, dtype=torch.float16)
        cfg = KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
        self.mgr = KVCacheManager(
            cfg, max_model_len=4096, scheduler_block_size=PAGE, hash_block_size=PAGE, enable_kv_cache_events=True
        )
        self.hasher = get_request_block_hasher(PAGE, sha256)

    def serve(self, reqs: Sequence[tuple[list[int], Any, str | None]]) -> None:
        """One scheduler step: the step's requests run together (prefill), then finish and free."""
        running = []
        for tokens, lora, salt in reqs:
            req = Request(
                f"r{next(_ids)}",
                tokens,
                SamplingParams(max_tokens=1),
                None,
                lora_request=lora,
                cache_salt=salt,
                block_hasher=self.hasher,
            )
            blocks, hit, _ = self.mgr.get_computed_blocks(req)
            if self.mgr.allocate_slots(req, len(tokens) - hit, hit, blocks) is not None:
                running.append(req)  # None: no room now (the scheduler would keep it waiting)
        for req in running:
            self.mgr.free(req)

    def flush(self) -> None:
        assert self.mgr.reset_prefix_cache()

    def truth(self) -> Counter[int]:
        """Published-hash copies of every cached block in the pool (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)."""
        out: Counter[int] = Counter()
        for blk in self.mgr.block_pool.blocks:
            if blk.block_hash is not None and not blk.is_null:
                digest = get_block_hash(blk.block_hash)
                out[signed(int.from_bytes(digest, "big") & ((1 << 64) - 1))] += 1
        return out


def to_kvevents(events: list) -> list[Event]:
    out: list[Event] = []
    for ev in events:
        if type(ev).__name__ == "AllBlocksCleared":
            out.append(AllBlocksCleared())
        elif type(ev).__name__ == "BlockStored":
            parent = None if ev.parent_block_hash is None else signed(ev.parent_block_hash)
            out.append(
                BlockStored(
                    [signed(h) for h in ev.block_hashes],
                    parent,
                    list(ev.token_ids),
                    ev.block_size,
                    ev.lora_id,
                    ev.medium,
                    ev.lora_name,
                )  # fmt: skip
            )
        else:
            out.append(BlockRemoved([signed(h) for h in ev.block_hashes], ev.medium))
    return out


_SAME = ("parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")


def decode_same(payload: bytes, events: list) -> bool:
    """vLLM's decoder reads kvevents' bytes as the events vLLM's pool emitted (hashes mod 2^64)."""
    got = _DECODER.decode(payload).events
    if [type(e).__name__ for e in got] != [type(e).__name__ for e in events]:
        return False
    for a, b in zip(got, events):
        if hasattr(b, "block_hashes") and [h % (1 << 64) for h in a.block_hashes] != list(b.block_hashes):
            return False
        for f in _SAME if type(b).__name__ == "BlockStored" else ():
            va, vb = getattr(a, f), getattr(b, f)
            if f == "parent_block_hash" and va is not None:
                va = va % (1 << 64)
            if va != vb:
                return False
    return True


def workload(n: int, seed: int = 9) -> list[tuple[list[int], Any, str | None]]:
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 30000) for _ in range(PAGE * rng.randint(1, 3))] for _ in range(6)]
    bodies = [[rng.randrange(1, 30000) for _ in range(rng.randint(8, 70))] for _ in range(40)]
    return [(rng.choice(systems) + rng.choice(bodies), rng.choice(ADAPTERS), rng.choice(SALTS)) for _ in range(n)]


def side() -> EngineSide:
    return EngineSide(
        source="vllm",
        new_engine=VllmEngine,
        new_publisher=lambda ep, rp: ZmqEventPublisher(0, endpoint=ep, replay_endpoint=rp, buffer_steps=5000),
        publish=lambda pub, events: pub.publish(KVEventBatch(ts=time.time(), events=events)),
        shutdown=lambda pub: pub.shutdown(),
        serve=VllmEngine.serve,
        flush=VllmEngine.flush,
        take_events=lambda engine: engine.mgr.take_events(),
        truth=VllmEngine.truth,
        to_kvevents=to_kvevents,
        decode_same=decode_same,
        requests=workload(STEPS * PER_STEP),
    )


def main(tmp: str) -> None:
    report = Report("vllm")
    report.standins = []
    run_engine(side(), report, tmp)
    report.emit()


if __name__ == "__main__":
    main(sys.argv[1])
