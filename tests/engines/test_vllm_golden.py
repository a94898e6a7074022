"""vLLM 0.33 golden vectors (made by running vLLM's own hashing code) reproduced by kvevents.engines.vllm."""

from __future__ import annotations

import json

import pytest

from kvevents.engines.vllm import (
    DEFAULT_SEED,
    event_extra_keys,
    hash_block,
    none_hash,
    tagged_extra_keys,
    to_event_hash,
    untag_extra_keys,
    vllm_block_hashes,
    vllm_event_hashes,
)
from kvevents.engines.vllm_wire import (
    decode_vllm_batch,
    encode_vllm_batch,
    removed_event,
    stored_event,
)
from kvevents.events import decode_batch
from tests.helpers.repo import REPO

VLLM_GOLDEN = REPO / "schemas" / "golden" / "vllm-0.33.json"
CASES = json.loads(VLLM_GOLDEN.read_text())["cases"]


def _lists(v):
    return [_lists(x) for x in v] if isinstance(v, (list, tuple)) else v


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_every_vector_reproduces(case):
    algo, seed, size = case["algo"], case["PYTHONHASHSEED"], case["block_size"]
    assert none_hash(algo, seed).hex() == case["none_hash"]
    digests = vllm_block_hashes(
        case["tokens"], size, hash_algo=algo, extra_keys_per_block=case["hash_extra_keys"], seed=seed
    )
    assert [d.hex() for d in digests] == case["digests"]
    assert [to_event_hash(d) for d in digests] == case["event_block_hashes"]
    assert (
        vllm_event_hashes(case["tokens"], size, hash_algo=algo, extra_keys_per_block=case["hash_extra_keys"], seed=seed)
        == case["event_block_hashes"]
    )
    if case["hash_extra_keys"] is not None:
        assert _lists(event_extra_keys(case["hash_extra_keys"])) == case["event_extra_keys"]


def test_extra_keys_built_from_request_fields_match_the_golden_ones():
    v03, v04 = (c for c in CASES if c["name"] in ("V03_cbor_lora", "V04_cbor_salt_lora"))
    lora = tagged_extra_keys(4, lora_name="adapter-a", lora_path="/adapters/a")
    assert _lists(lora) == v03["hash_extra_keys"]
    salted = tagged_extra_keys(4, lora_name="adapter-a", lora_path="/adapters/a", cache_salt="tenant-a")
    assert _lists(salted) == v04["hash_extra_keys"]
    assert untag_extra_keys(salted[0]) == ("adapter-a", "tenant-a")
    mm = tagged_extra_keys(2, mm_per_block=[[("img0", 3)], []], prompt_embeds_digest=b"\x01" * 32)
    assert mm[0] == (("mm", "img0", 3), ("prompt_embeds", b"\x01" * 32))
    assert untag_extra_keys(mm[0]) == (("img0", 3), b"\x01" * 32)


def test_chain_continues_from_a_parent_and_matches_hash_block():
    case = CASES[0]
    d = vllm_block_hashes(case["tokens"], 4, hash_algo="sha256_cbor")
    assert vllm_block_hashes(case["tokens"][8:], 4, hash_algo="sha256_cbor", parent=d[1]) == d[2:]
    assert hash_block(none_hash("sha256_cbor"), case["tokens"][:4], None, "sha256_cbor") == d[0]
    assert none_hash("sha256_cbor", DEFAULT_SEED) == none_hash("sha256_cbor")
    assert vllm_block_hashes([1, 2, 3], 4) == []  # a partial block is never hashed


def test_vllm_md_sha256_cbor_block16_value():
    d = vllm_block_hashes(list(range(16)), 16, hash_algo="sha256_cbor")[0]
    assert d.hex().startswith("dc918a88") and d.hex().endswith("ac0749")
    assert to_event_hash(d) == 2233398808101521225


@pytest.mark.parametrize(
    "call",
    [
        lambda: vllm_block_hashes([1, 2], 0),
        lambda: vllm_block_hashes([1, -2], 1),
        lambda: vllm_block_hashes([1, 2], 1, hash_algo="xxhash"),
        lambda: vllm_block_hashes([1, 2], 1, extra_keys_per_block=[None]),
        lambda: untag_extra_keys([("weird", 1)]),
        lambda: to_event_hash(b"short"),
        lambda: none_hash("sha256", 5),  # type: ignore[arg-type]
    ],
)
def test_bad_input_is_a_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_vllm_wire_round_trip_keeps_every_field():
    store = stored_event(
        [2**64 - 1, 5], None, list(range(8)), 4, lora_name="a", extra_keys=[["a", "salt"], ["a"]], group_idx=1
    )
    payload = encode_vllm_batch(1.5, [store, removed_event([2**64 - 1], group_idx=1), {"type": "AllBlocksCleared"}], 3)
    b = decode_vllm_batch(payload)
    assert b.data_parallel_rank == 3 and len(b.events) == 3
    st, rm = b.events[0], b.events[1]
    assert st.block_hashes == [2**64 - 1, 5] and st.extra_keys == [["a", "salt"], ["a"]] and st.group_idx == 1
    assert rm.block_hashes == [2**64 - 1] and rm.group_idx == 1
    contract = decode_batch(payload)  # strict-shaped: kvevents' own decoder reads it too (same 64 bits)
    assert contract.events[0].block_hashes == [-1, 5]
    # required keys present even when nil, optional ones absent when nil
    assert list(store)[:8] == [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ]
    assert "kv_cache_spec_kind" not in store


def test_vllm_decoder_reads_bytes_hashes_positional_events_and_trailing_elements():
    import msgspec

    digest = b"\x07" * 32
    raw = [
        1.0,
        [
            ["BlockStored", [digest], None, [1, 2], 2, None, "GPU", None, [["x"]], 0],
            ["BlockRemoved", [digest], "GPU", 0],
        ],
        None,
        99,
        "pub",
    ]
    b = decode_vllm_batch(msgspec.msgpack.encode(raw))
    assert b.events[0].block_hashes == [digest] and b.events[0].extra_keys == [["x"]] and b.events[1].group_idx == 0
