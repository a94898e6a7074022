"""VllmSimWorker emits what a vLLM 0.33 worker emits: its hash chain as uint64, extra keys, groups, per-hash removals."""

from __future__ import annotations

import json

import msgspec
import pytest

from kvevents.events import decode_batch
from kvevents.sim.vllm import VllmSimWorker
from tests.helpers.repo import REPO

CASES = json.loads((REPO / "schemas" / "golden" / "vllm-0.33.json").read_text())["cases"]


def raw_events(sim: VllmSimWorker) -> tuple[list, list]:
    payload = sim.take_payload(1700000000.5)
    assert payload is not None
    batch = msgspec.msgpack.decode(payload)
    return batch, batch[1]


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c["name"] in ("V01_cbor_plain", "V02_pickle_plain", "V04_cbor_salt_lora")],
    ids=lambda c: c["name"],
)
def test_published_hashes_and_extra_keys_equal_the_golden_ones(case):
    sim = VllmSimWorker(block_size=case["block_size"], hash_algo=case["algo"], lora_paths={"adapter-a": "/adapters/a"})
    lora = "adapter-a" if case["event_extra_keys"] else None
    salt = "tenant-a" if case["name"] == "V04_cbor_salt_lora" else None
    want = case["event_block_hashes"]
    sim.serve(case["tokens"], cache_salt=salt, lora_name=lora)
    batch, events = raw_events(sim)
    assert len(batch) == 3 and isinstance(batch[0], float) and batch[2] == 0  # the strict 3-element batch
    (st,) = events
    assert st["type"] == "BlockStored" and st["block_hashes"] == want and st["parent_block_hash"] is None
    assert list(st)[:8] == [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ]
    assert st["group_idx"] == 0 and st["medium"] == "GPU" and st["token_ids"] == case["tokens"]
    assert st.get("extra_keys") == case["event_extra_keys"]


def test_hits_parents_evictions_one_removal_per_hash_and_duplicates():
    sim = VllmSimWorker(block_size=2, capacity_blocks=4)
    sim.serve([1, 2, 3, 4])
    _, (first,) = raw_events(sim)
    res = sim.serve([1, 2, 3, 4, 5, 6])  # two blocks hit, one new: parent is the last hit
    assert res.hit_tokens == 4
    _, (second,) = raw_events(sim)
    assert second["parent_block_hash"] == first["block_hashes"][1] and second["token_ids"] == [5, 6]
    sim.serve([9, 9, 8, 8])  # needs 2 blocks: 1 free, then the LRU one goes (the request's tail first)
    _, evs = raw_events(sim)
    removed = [e for e in evs if e["type"] == "BlockRemoved"]
    assert [len(e["block_hashes"]) for e in removed] == [1] and removed[0]["group_idx"] == 0
    assert removed[0]["block_hashes"] == second["block_hashes"]
    assert evs[-1]["type"] == "BlockStored" and evs.index(removed[0]) < evs.index(evs[-1])  # evict, then store
    decode_batch(
        sim.take_payload() or b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x90\x00"
    )  # the contract decoder reads it


def test_no_batch_for_an_empty_step_and_reset_is_all_blocks_cleared():
    sim = VllmSimWorker(block_size=4)
    assert sim.take_payload() is None
    sim.serve([1, 2, 3])  # no full block: nothing cached, nothing sent
    assert sim.take_payload() is None
    sim.serve([1, 2, 3, 4])
    sim.reset()
    _, evs = raw_events(sim)
    assert evs[-1] == {"type": "AllBlocksCleared"} and sim.cached_blocks() == []


def test_a_sliding_window_group_spans_null_blocks():
    sim = VllmSimWorker(block_size=2, sliding_window_blocks=1)
    sim.serve(list(range(8)))
    _, (full, window) = raw_events(sim)
    assert full["group_idx"] == 0 and window["group_idx"] == 1 and window["kv_cache_spec_kind"] == "sliding_window"
    assert window["block_hashes"] == full["block_hashes"][-1:] and window["token_ids"] == full["token_ids"]


def test_bad_settings_are_value_errors():
    for kw in ({"block_size": 0}, {"capacity_blocks": 0}, {"hash_algo": "xxhash"}):
        with pytest.raises(ValueError):
            VllmSimWorker(**kw)
