"""Check vLLM golden vectors (`kvevents golden`) (schemas/golden/vllm-0.33.json, made by running vLLM 0.33).

Per case: NONE_HASH, every block digest, the published uint64s, the events' untagged extra keys,
and one BlockStored through the vLLM wire (encode, our vLLM decoder, the contract decoder).
"""

from __future__ import annotations

from typing import Any

from kvevents.engines.vllm import (
    event_extra_keys,
    none_hash,
    to_event_hash,
    vllm_block_hashes,
)
from kvevents.engines.vllm_wire import (
    decode_vllm_batch,
    encode_vllm_batch,
    stored_event,
)
from kvevents.events import BlockStored, decode_batch
from kvevents.golden.item import Item

__all__ = ["check_vllm_golden", "is_vllm_golden"]

_I64 = 2**63


def is_vllm_golden(golden: dict[str, Any]) -> bool:
    """True for a vLLM golden file (its cases name a hash algo)."""
    cases = golden.get("cases")
    return isinstance(cases, list) and bool(cases) and all(isinstance(c, dict) and "algo" in c for c in cases)


def _jsonable(keys: Any) -> Any:
    """Tuples as lists (the golden file is JSON)."""
    if isinstance(keys, (list, tuple)):
        return [_jsonable(k) for k in keys]
    return keys


def _case(case: dict[str, Any]) -> Item:
    item = Item("vllm cases", str(case.get("name", "?")))

    def run() -> None:
        algo, seed, size = case["algo"], case["PYTHONHASHSEED"], case["block_size"]
        item.expect("none_hash", none_hash(algo, seed).hex(), case["none_hash"])
        digests = vllm_block_hashes(
            case["tokens"], size, hash_algo=algo, extra_keys_per_block=case["hash_extra_keys"], seed=seed
        )
        item.expect("digests", [d.hex() for d in digests], case["digests"])
        ints = [to_event_hash(d) for d in digests]
        item.expect("event_block_hashes", ints, case["event_block_hashes"])
        tagged = case["hash_extra_keys"]
        untagged = None if tagged is None else _jsonable(event_extra_keys(tagged))
        item.expect("event_extra_keys", untagged, case["event_extra_keys"])
        store = stored_event(ints, None, case["tokens"], size, lora_name=None, extra_keys=untagged, group_idx=0)
        payload = encode_vllm_batch(1700000000.5, [store], 0)
        ev = decode_vllm_batch(payload).events[0]
        item.expect("vllm wire hashes", ev.block_hashes, case["event_block_hashes"])  # type: ignore[union-attr]
        item.expect("vllm wire extra_keys", _jsonable(ev.extra_keys), untagged)  # type: ignore[union-attr]
        ours = decode_batch(payload).events[0]
        assert isinstance(ours, BlockStored)
        item.expect(
            "contract decoder (same 64 bits)", [h % 2**64 for h in ours.block_hashes], case["event_block_hashes"]
        )

    item.run("case", run)
    return item


def check_vllm_golden(golden: dict[str, Any]) -> list[Item]:
    """One Item per vLLM golden case, in file order."""
    return [_case(c) for c in golden["cases"]]
