"""Every value of the golden file (SGLang 0.5.20), reproduced byte for byte.

Expected bytes for our BlockStored encoding are derived from the golden hex by inserting, as
hex text, exactly the keys we always write and SGLang omits (`medium` / `lora_name` as nil);
that derivation is independent of msgspec, so the comparisons are exact.
"""

from __future__ import annotations

import hashlib
import json
from array import array

import numpy as np
import pytest

from kvevents.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
    encode_event,
    event_to_dict,
)
from kvevents.hashing import (
    Namespace,
    event_hashes,
    event_seed,
    int64_to_hex16,
    pack_tokens,
    page_hashes,
    storage_hashes,
    storage_seed,
    to_int64,
)
from tests.helpers.repo import GOLDEN_PATH

GOLDEN = json.loads(GOLDEN_PATH.read_text())
CASES = GOLDEN["cases"]
WIRE = GOLDEN["wire"]
SCENARIOS = GOLDEN["scenarios"]

MEDIUM_NIL = "a6" + b"medium".hex() + "c0"
LORA_NAME_NIL = "a9" + b"lora_name".hex() + "c0"
LORA_ID_NIL = "a7" + b"lora_id".hex() + "c0"  # the last key SGLang always writes
MEDIUM_GPU = "a6" + b"medium".hex() + "a3" + b"GPU".hex()


def insert_once(hex_text: str, anchor: str, inserted: str) -> str:
    """hex_text with `inserted` placed right after the single occurrence of `anchor`."""
    assert hex_text.count(anchor) == 1, f"anchor {anchor} must occur exactly once"
    return hex_text.replace(anchor, anchor + inserted)


def event_fields(ev: object) -> dict:
    return event_to_dict(ev)  # type: ignore[arg-type]


def assert_event_equals(ev: object, want: dict) -> None:
    """Field by field; a key absent from the golden dict means None."""
    ours = event_fields(ev)
    assert ours["type"] == want["type"]
    assert set(want) <= set(ours), f"golden keys {set(want) - set(ours)} are not event fields"
    for key, value in ours.items():
        expected = want.get(key)
        assert value == expected and type(value) is type(expected), (key, value, expected)


def wrap_event(raw: bytes) -> bytes:
    """A one-event batch [0.0, [event], nil] around raw event bytes."""
    return b"\x93\xcb" + bytes(8) + b"\x91" + raw + b"\xc0"


# ------------------------------------------------------------------ cases


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case_hashes(case: dict) -> None:
    inp, st, ev = case["inputs"], case["storage"], case["events"]
    ps, parent, tokens = inp["page_size"], inp["parent_tokens"], inp["tokens"]
    ns = Namespace(inp["extra_key"], inp["cache_salt"])
    norm = case["radix_key_after_normalisation"]
    assert (ns.extra_key, ns.cache_salt) == (norm["extra_key"], norm["cache_salt"])
    assert storage_seed(ns) == st["namespace_seed_hex_used"] == st["namespace_seed_hex_from_raw_inputs"]
    if parent is None:
        assert event_seed(ns) == ev["event_chain_seed_hex"]
        s_prior = e_prior = None
        assert st["parent_storage_hashes_hex"] is None and ev["parent_event_hashes_hex"] is None
    else:
        assert ev["event_chain_seed_hex"].startswith("n/a")
        p_st, p_ev = storage_hashes(parent, ps, ns), event_hashes(parent, ps, ns)
        assert p_st == st["parent_storage_hashes_hex"]
        assert p_ev == ev["parent_event_hashes_hex"]
        s_prior, e_prior = p_st[-1], p_ev[-1]
        # the whole sequence hashed at once gives parent + child
        assert storage_hashes(parent + tokens, ps, ns) == p_st + st["storage_hashes_hex"]
        assert event_hashes(parent + tokens, ps, ns) == p_ev + ev["event_hashes_hex"]
    assert storage_hashes(tokens, ps, ns, s_prior) == st["storage_hashes_hex"]
    assert event_hashes(tokens, ps, ns, e_prior) == ev["event_hashes_hex"]
    ints = [to_int64(h) for h in ev["event_hashes_hex"]]
    assert ints == ev["published_block_hashes_int64"]
    assert [int64_to_hex16(v) for v in ints] == ev["published_block_hashes_hex16_twos_complement"]
    assert [h[:16] for h in ev["event_hashes_hex"]] == ev["published_block_hashes_hex16_twos_complement"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_case_block_stored_events(case: dict) -> None:
    """The BlockStored a cache built on our hashing emits equals SGLang's, field by field."""
    inp, ev = case["inputs"], case["events"]
    ps, parent, tokens = inp["page_size"], inp["parent_tokens"], inp["tokens"]
    ns = Namespace(inp["extra_key"], inp["cache_salt"])
    parent_int = None
    if parent is not None:
        p_hex = event_hashes(parent, ps, ns)
        mine = BlockStored([to_int64(h) for h in p_hex], None, parent, ps, None, "GPU", None, ns.cache_salt)
        (want,) = ev["parent_events"]
        assert_event_equals(mine, want)
        parent_int = to_int64(p_hex[-1])
    else:
        assert ev["parent_events"] is None
    ints = [to_int64(h) for h in event_hashes(tokens, ps, ns, p_hex[-1] if parent else None)]
    mine = BlockStored(ints, parent_int, tokens, ps, None, "GPU", None, ns.cache_salt)
    (want,) = ev["block_stored_events"]
    assert_event_equals(mine, want)


def test_extra_key_cases_share_event_hashes_but_not_storage() -> None:
    by_id = {c["id"]: c for c in CASES}
    plain, lora = by_id["C02_ps4_plain_3pages"], by_id["C04_ps4_lora_only"]
    salt, both = by_id["C05_ps4_salt_only"], by_id["C06_ps4_lora_and_salt"]
    assert lora["events"]["event_hashes_hex"] == plain["events"]["event_hashes_hex"]
    assert both["events"]["event_hashes_hex"] == salt["events"]["event_hashes_hex"]
    storages = {c["storage"]["storage_hashes_hex"][0] for c in (plain, lora, salt, both)}
    assert len(storages) == 4


# ------------------------------------------------------------------ seeds and direct vectors


@pytest.mark.parametrize("key", list(GOLDEN["namespace_seeds_storage"]))
def test_namespace_seed(key: str) -> None:
    extra_key, cache_salt = json.loads(key)
    assert storage_seed(Namespace(extra_key, cache_salt)) == GOLDEN["namespace_seeds_storage"][key]


def test_direct_vectors() -> None:
    d = GOLDEN["direct"]
    # "no page size" in SGLang is one digest over the whole sequence, even an empty one
    assert hashlib.sha256(pack_tokens([])).hexdigest() == d["get_hash_str_empty_no_page_size"]
    assert page_hashes([1, 2, 3], 3) == [d["get_hash_str_[1,2,3]_no_page_size"]]
    assert page_hashes([1, 2, 3], 4) == d["get_hash_str_[1,2,3]_page_size_4"]
    assert page_hashes([], 4) == d["get_hash_str_empty_page_size_4"] == []
    assert page_hashes(list(range(5, 11)), 4) == d["partial_page_plain_ps4_tokens_5..10"]


def test_explicit_prior_suppresses_seeding() -> None:
    e = GOLDEN["direct"]["explicit_prior"]
    ns = Namespace(*e["namespace"])
    assert storage_hashes(e["tokens"], 4, ns, e["prior_hex"]) == e["get_storage_hash_str_with_prior"]
    assert event_hashes(e["tokens"], 4, ns, e["prior_hex"]) == e["get_hash_str_with_prior"]
    assert page_hashes(e["tokens"], 4, e["prior_hex"]) == e["get_hash_str_with_prior"]
    # the prior is the (lora-a, tenant-a) storage hash of page [1, 2, 3, 4]: a worked example
    assert storage_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, ns) == [e["prior_hex"], *e["get_storage_hash_str_with_prior"]]


@pytest.mark.parametrize("make", [list, tuple, lambda t: array("q", t), lambda t: array("Q", t), np.array])
def test_token_u32_max(make) -> None:
    d = GOLDEN["direct"]["token_u32_max"]
    assert d["list"] == d["array_q"]
    assert page_hashes(make([2**32 - 1]), 1) == d["list"]
    assert page_hashes(make([2**32 - 1]), 4) == d["list"]


@pytest.mark.parametrize("bad", [2**32, -1, 2**40, -(2**40)])
@pytest.mark.parametrize(
    "make",
    [list, tuple, lambda t: array("q", t), np.array, iter],
    ids=["list", "tuple", "array_q", "numpy", "iterator"],
)
def test_out_of_range_token_rejected(bad: int, make) -> None:
    d = GOLDEN["direct"]
    assert d["token_u32_max_plus_1"]["list"].startswith("ERROR")
    assert d["token_negative"]["list"].startswith("ERROR")
    tokens = make([7, 8, 9, bad, 10])
    for fn in (
        lambda: page_hashes(tokens, 2),
        lambda: storage_hashes(tokens, 2, Namespace("k", "s")),
        lambda: event_hashes(tokens, 2, Namespace("k", "s")),
    ):
        if make is iter:
            tokens = make([7, 8, 9, bad, 10])
        with pytest.raises(ValueError) as info:
            fn()
        assert str(bad) in str(info.value) and "position 3" in str(info.value)


@pytest.mark.parametrize("hex_hash", list(GOLDEN["direct"]["hash_str_to_int64"]))
def test_hash_str_to_int64(hex_hash: str) -> None:
    value = GOLDEN["direct"]["hash_str_to_int64"][hex_hash]
    assert to_int64(hex_hash) == value
    assert int64_to_hex16(value) == hex_hash[:16]


# ------------------------------------------------------------------ wire section


def test_wire_events_decode_to_golden() -> None:
    for key in ("BlockStored_minimal", "BlockStored_gpu_salt_session", "BlockRemoved_cpu", "AllBlocksCleared"):
        raw = bytes.fromhex(WIRE[key]["msgpack_hex"])
        (ev,) = decode_batch(wrap_event(raw)).events
        assert_event_equals(ev, WIRE[key]["decoded"])


def test_wire_exact_where_field_sets_agree() -> None:
    removed = BlockRemoved([3], "CPU_PINNED")
    assert encode_event(removed).hex() == WIRE["BlockRemoved_cpu"]["msgpack_hex"]
    assert encode_event(AllBlocksCleared()).hex() == WIRE["AllBlocksCleared"]["msgpack_hex"]
    empty = KVEventBatch(0.0, [], 3)
    assert encode_batch(empty).hex() == WIRE["KVEventBatch_ts0_empty_rank3"]["msgpack_hex"]
    assert encode_batch(KVEventBatch(0, [], 3)).hex() == WIRE["KVEventBatch_ts0_empty_rank3"]["msgpack_hex"]


def _stored_minimal() -> BlockStored:
    return BlockStored([-1, 2**63 - 1], None, [1, 2], 1, None, None, None)


def _stored_full() -> BlockStored:
    return BlockStored([-1, 2**63 - 1], 5, [1, 2], 1, None, "GPU", None, "tenant-a", "s1")


def expected_minimal_hex() -> str:
    golden = WIRE["BlockStored_minimal"]["msgpack_hex"]
    assert golden.startswith("86")  # 6 keys: type .. lora_id; no medium, no lora_name
    return "88" + insert_once(golden[2:], LORA_ID_NIL, MEDIUM_NIL + LORA_NAME_NIL)


def expected_full_hex() -> str:
    golden = WIRE["BlockStored_gpu_salt_session"]["msgpack_hex"]
    assert golden.startswith("89")  # 9 keys incl. medium, cache_salt, session_id; no lora_name
    return "8a" + insert_once(golden[2:], MEDIUM_GPU, LORA_NAME_NIL)


def test_block_stored_bytes_equal_golden_plus_lora_name() -> None:
    assert encode_event(_stored_minimal()).hex() == expected_minimal_hex()
    assert encode_event(_stored_full()).hex() == expected_full_hex()
    # and what we decode from the golden bytes re-encodes the same way
    for key, expected in (
        ("BlockStored_minimal", expected_minimal_hex()),
        ("BlockStored_gpu_salt_session", expected_full_hex()),
    ):
        (ev,) = decode_batch(wrap_event(bytes.fromhex(WIRE[key]["msgpack_hex"]))).events
        assert encode_event(ev).hex() == expected


def test_batch_envelope_with_events() -> None:
    entry = WIRE["KVEventBatch_ts0_no_rank"]
    golden = entry["msgpack_hex"]
    minimal = WIRE["BlockStored_minimal"]["msgpack_hex"]
    full = WIRE["BlockStored_gpu_salt_session"]["msgpack_hex"]
    removed = WIRE["BlockRemoved_cpu"]["msgpack_hex"]
    cleared = WIRE["AllBlocksCleared"]["msgpack_hex"]
    envelope = "93" + "cb" + "00" * 8 + "94"
    assert golden == envelope + minimal + full + removed + cleared + "c0"
    expected = envelope + expected_minimal_hex() + expected_full_hex() + removed + cleared + "c0"
    batch = decode_batch(bytes.fromhex(golden))
    assert batch.ts == 0.0 and batch.data_parallel_rank is None and batch.epoch is None
    want_ts, want_events, want_rank = entry["decoded"]
    assert (batch.ts, batch.data_parallel_rank) == (want_ts, want_rank)
    assert len(batch.events) == len(want_events)
    for ev, want in zip(batch.events, want_events):
        assert_event_equals(ev, want)
    assert [type(e).__name__ for e in batch.events] == WIRE["typed_decoder_round_trip_ok"]
    assert encode_batch(batch).hex() == expected
    ours = KVEventBatch(0.0, [_stored_minimal(), _stored_full(), BlockRemoved([3], "CPU_PINNED"), AllBlocksCleared()])
    assert encode_batch(ours).hex() == expected


def test_empty_batch_decodes() -> None:
    entry = WIRE["KVEventBatch_ts0_empty_rank3"]
    batch = decode_batch(bytes.fromhex(entry["msgpack_hex"]))
    assert [batch.ts, batch.events, batch.data_parallel_rank] == entry["decoded"]


# ------------------------------------------------------------------ scenarios


def _scenario_wire(steps: list) -> tuple[str, list, list]:
    (wire_step,) = [s for s in steps if "wire_decoded_generic" in s]
    (key,) = [k for k in wire_step if k.endswith("_msgpack_hex")]
    last_events = [s for s in steps if "events" in s][-1]["events"]
    return wire_step[key], wire_step["wire_decoded_generic"], last_events


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_wire(name: str) -> None:
    golden_hex, generic, step_events = _scenario_wire(SCENARIOS[name])
    batch = decode_batch(bytes.fromhex(golden_hex))
    assert batch.ts == generic[0] == 1700000000.5
    assert batch.data_parallel_rank is None is generic[2]
    assert len(batch.events) == len(generic[1]) == len(step_events) == 1
    assert_event_equals(batch.events[0], generic[1][0])
    assert_event_equals(batch.events[0], step_events[0])
    # ours = golden with lora_name (nil) inserted after medium
    assert golden_hex[20:22] == "91" and golden_hex[22] == "8"
    n = int(golden_hex[23], 16)
    expected = golden_hex[:22] + f"8{n + 1:x}" + insert_once(golden_hex[24:], MEDIUM_GPU, LORA_NAME_NIL)
    assert encode_batch(batch).hex() == expected
    salt = step_events[0]["cache_salt"]
    ours = BlockStored(step_events[0]["block_hashes"], None, step_events[0]["token_ids"], 4, None, "GPU", None, salt)
    assert encode_batch(KVEventBatch(1700000000.5, [ours])).hex() == expected


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_hashes_recomputed_from_tokens(name: str) -> None:
    """Every BlockStored of a scenario carries the event chain of its tokens (extra_key ignored)."""
    checked = 0
    for step in SCENARIOS[name]:
        for ev in step.get("events", []):
            if ev["type"] != "BlockStored":
                continue
            ns = Namespace("ignored-extra-key", ev["cache_salt"])
            if ev["parent_block_hash"] is None:
                ints = [to_int64(h) for h in event_hashes(ev["token_ids"], ev["block_size"], ns)]
                assert ints == ev["block_hashes"]
            else:
                ints = [to_int64(h) for h in event_hashes(step["tokens"], ev["block_size"], ns)]
                k = len(ev["block_hashes"])
                assert ints[-k:] == ev["block_hashes"] and ints[-k - 1] == ev["parent_block_hash"]
                assert step["tokens"][-len(ev["token_ids"]) :] == ev["token_ids"]
            checked += 1
    assert checked >= 4


def test_golden_checker_passes(golden: dict) -> None:
    from kvevents.golden import check_golden

    items = check_golden(golden)
    assert items and all(i.ok for i in items), [(i.name, i.failures) for i in items if not i.ok]
    assert sum(i.checks for i in items) > 150


def _flip_hex(text: str, at: int) -> str:
    return text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1 :]


TAMPER = {
    "case storage": lambda g: g["cases"][4]["storage"]["storage_hashes_hex"].__setitem__(1, "00" * 32),
    "case event seed": lambda g: g["cases"][5]["events"].__setitem__("event_chain_seed_hex", "11" * 32),
    "case event field": lambda g: g["cases"][8]["events"]["parent_events"][0].__setitem__("medium", "CPU"),
    "seed": lambda g: g["namespace_seeds_storage"].__setitem__('["a", "bc"]', "22" * 32),
    "direct": lambda g: g["direct"]["partial_page_plain_ps4_tokens_5..10"].reverse(),
    "int64": lambda g: g["direct"]["hash_str_to_int64"].__setitem__("f" * 64, -2),
    "scenario wire": lambda g: g["scenarios"]["ps4_ns_None_None"][-1].update(
        {k: _flip_hex(v, 200) for k, v in g["scenarios"]["ps4_ns_None_None"][-1].items() if k.endswith("_hex")}),
    "scenario hash": lambda g: g["scenarios"]["ps4_ns_lora-a_tenant-a"][2]["events"][0].__setitem__("parent_block_hash", 1),
    "wire bytes": lambda g: g["wire"]["BlockRemoved_cpu"].__setitem__("msgpack_hex", _flip_hex(WIRE["BlockRemoved_cpu"]["msgpack_hex"], 40)),
    "wire decoded": lambda g: g["wire"]["BlockStored_minimal"]["decoded"].__setitem__("lora_id", 0),
    "wire order": lambda g: g["wire"]["typed_decoder_round_trip_ok"].reverse(),
}  # fmt: skip


@pytest.mark.parametrize("name", list(TAMPER))
def test_golden_checker_detects_each_tampering(name: str) -> None:
    from kvevents.golden import check_golden

    tampered = json.loads(json.dumps(GOLDEN))
    TAMPER[name](tampered)
    bad = [i for i in check_golden(tampered) if not i.ok]
    assert len(bad) == 1, [(i.name, i.failures) for i in bad]
