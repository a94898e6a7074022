"""Wire format (the contract, "Wire format"): structs, encoder, tolerant decoder, strict vLLM decoding, JSON Schema."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Union

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvevents.errors import DecodeError
from kvevents.events import (
    AllBlocksCleared,
    BatchEncoder,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    batch_json_schema,
    decode_batch,
    encode_batch,
    encode_event,
    event_to_dict,
)
from tests.helpers.repo import GOLDEN_PATH, REPO

SCHEMA_PATH = REPO / "schemas" / "kvevent-batch.schema.json"
GOLDEN = json.loads(GOLDEN_PATH.read_text())
enc = msgspec.msgpack.encode

# ------------------------------------------------------------------ strategies

hash_st = st.integers(-(2**63), 2**63 - 1)
opt_str = st.none() | st.text(max_size=6)
medium_st = st.none() | st.sampled_from(["GPU", "CPU_PINNED", "STORAGE"])
stored_st = st.builds(
    BlockStored,
    st.lists(hash_st, max_size=5),
    st.none() | hash_st,
    st.lists(st.integers(0, 2**32 - 1), max_size=8),
    st.integers(1, 64),
    st.none() | st.integers(0, 1000),
    medium_st,
    opt_str,
    opt_str,
    opt_str,
)
removed_st = st.builds(BlockRemoved, st.lists(hash_st, max_size=5), medium_st)
event_st = stored_st | removed_st | st.just(AllBlocksCleared())
batch_st = st.builds(
    KVEventBatch,
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(event_st, max_size=5),
    st.none() | st.integers(0, 64),
    st.none() | st.integers(0, 2**63 - 1),
)
leaf_st = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.binary(max_size=10)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "block_hashes", "token_ids"])
)
obj_st = st.recursive(
    leaf_st,
    lambda kids: st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=12) | st.sampled_from(
        ["type", "block_hashes", "token_ids", "block_size", "medium", "parent_block_hash"]), kids, max_size=6),
    max_leaves=20,
)  # fmt: skip


def golden_payloads() -> list[bytes]:
    out = [bytes.fromhex(GOLDEN["wire"][k]["msgpack_hex"]) for k in GOLDEN["wire"] if k.startswith("KVEventBatch")]
    for steps in GOLDEN["scenarios"].values():
        for step in steps:
            out += [bytes.fromhex(v) for k, v in step.items() if k.endswith("_msgpack_hex")]
    return out


def sample_batch() -> KVEventBatch:
    return KVEventBatch(
        1700000000.25,
        [
            AllBlocksCleared(),
            BlockStored([-1, 2**63 - 1, 5], None, [1, 2, 3], 1, None, "GPU", None, "tenant-a"),
            BlockStored([7], 5, [4, 5], 2, 3, "CPU_PINNED", "lora-x", None, "sess"),
            BlockRemoved([-(2**63), 3], "GPU"),
            BlockRemoved([], None),
        ],
        2,
        2**62,
    )


# ------------------------------------------------------------------ encoding


@pytest.mark.parametrize("encoding", ["map", "array"])
@given(batch=batch_st)
def test_round_trip(encoding: str, batch: KVEventBatch) -> None:
    payload = encode_batch(batch, event_encoding=encoding)  # type: ignore[arg-type]
    assert decode_batch(payload) == batch
    assert BatchEncoder(encoding).encode(batch.ts, batch.events, batch.data_parallel_rank, batch.epoch) == payload  # type: ignore[arg-type]


def test_encoded_keys_and_layout() -> None:
    stored = BlockStored([1], None, [1], 1, None, None, None)
    assert list(msgspec.msgpack.decode(encode_event(stored))) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"
    ]  # fmt: skip
    full = BlockStored([1], 2, [1], 1, 3, "GPU", "l", "s", "x")
    assert list(msgspec.msgpack.decode(encode_event(full)))[-2:] == ["cache_salt", "session_id"]
    assert msgspec.msgpack.decode(encode_event(BlockRemoved([1], None))) == {
        "type": "BlockRemoved", "block_hashes": [1], "medium": None}  # fmt: skip
    assert msgspec.msgpack.decode(encode_event(AllBlocksCleared())) == {"type": "AllBlocksCleared"}
    assert encode_event(full, event_encoding="array") == enc(  # salted: SGLang <= 0.5.19's map at [7]
        ["BlockStored", [1], 2, [1], 1, 3, "GPU", {"cache_salt": "s", "session_id": "x", "lora_name": "l"}])  # fmt: skip
    assert encode_event(BlockStored([1], 2, [1], 1, 3, "GPU", "l"), event_encoding="array") == enc(
        ["BlockStored", [1], 2, [1], 1, 3, "GPU", "l"])  # unsalted: vLLM's lora_name at [7]  # fmt: skip
    assert encode_event(stored, event_encoding="array") == enc(["BlockStored", [1], None, [1], 1, None, None, None])
    assert encode_event(BlockRemoved([1], "GPU"), event_encoding="array") == enc(["BlockRemoved", [1], "GPU"])
    assert encode_event(AllBlocksCleared(), event_encoding="array") == enc(["AllBlocksCleared"])


def test_batch_envelope() -> None:
    b = KVEventBatch(0, [], None)
    assert encode_batch(b) == bytes.fromhex("93cb0000000000000000" + "90c0")  # ts always float64
    assert encode_batch(KVEventBatch(1.5, [], 1, 7)) == enc([1.5, [], 1, 7])
    assert msgspec.msgpack.decode(encode_batch(sample_batch()))[3] == 2**62
    with pytest.raises(ValueError):
        encode_batch(b, event_encoding="json")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_event(AllBlocksCleared(), event_encoding="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        BatchEncoder("x")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_event("nope", event_encoding="array")  # type: ignore[arg-type]


def test_event_to_dict() -> None:
    d = event_to_dict(BlockRemoved([1], "GPU"))
    assert list(d) == ["type", "block_hashes", "medium", "lora_name"] and d["type"] == "BlockRemoved"
    assert event_to_dict(AllBlocksCleared()) == {"type": "AllBlocksCleared"}
    assert event_to_dict(sample_batch().events[1])["lora_name"] is None


# ------------------------------------------------------------------ strict decoding (vLLM 0.33)


class VStored(msgspec.Struct, tag="BlockStored"):
    """vLLM 0.33's required BlockStored keys: decoding fails if any is absent."""

    block_hashes: list[int]
    parent_block_hash: Union[int, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]
    lora_name: Union[str, None]


class VRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Union[str, None]


class VCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class VBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Union[VStored, VRemoved, VCleared]]
    data_parallel_rank: Union[int, None] = None


STRICT = msgspec.msgpack.Decoder(VBatch)


def test_our_payloads_pass_a_strict_vllm_decoder() -> None:
    batch = sample_batch()
    decoded = STRICT.decode(encode_batch(batch))  # 4th element (epoch) and extra keys ignored
    assert [type(e).__name__[1:] for e in decoded.events] == ["Cleared", "Stored", "Stored", "Removed", "Removed"]
    assert decoded.events[1].block_hashes == [-1, 2**63 - 1, 5] and decoded.events[1].medium == "GPU"
    assert decoded.events[2].lora_name == "lora-x" and decoded.data_parallel_rank == 2
    # SGLang's own bytes (no medium/lora_name) are what a strict decoder rejects: why we always write them
    with pytest.raises(msgspec.ValidationError, match="medium|lora_name"):
        STRICT.decode(bytes.fromhex(GOLDEN["wire"]["KVEventBatch_ts0_no_rank"]["msgpack_hex"]))
    minimal = BlockStored([1], None, [1], 1, None, None, None)
    assert STRICT.decode(encode_batch(KVEventBatch(0.0, [minimal]))).events[0].lora_name is None


@given(batch=batch_st)
def test_strict_decoder_accepts_every_encoded_batch(batch: KVEventBatch) -> None:
    decoded = STRICT.decode(encode_batch(batch))
    assert len(decoded.events) == len(batch.events)


# ------------------------------------------------------------------ tolerant decoding


def test_legacy_positional_sglang() -> None:
    payload = enc([1.0, [
        ["BlockStored", [1, 2], None, [1, 2], 1, None, "GPU", {"cache_salt": "t", "future": 1}],
        ["BlockStored", [3], 2, [3], 1, 4],  # before medium existed
        ["BlockStored", [4], 3, [4], 1, None, None],
        ["BlockRemoved", [1, 2], "GPU"],
        ["BlockRemoved", [3]],
        ["AllBlocksCleared"],
    ], 0])  # fmt: skip
    b = decode_batch(payload)
    assert b.events == [
        BlockStored([1, 2], None, [1, 2], 1, None, "GPU", None, "t"),
        BlockStored([3], 2, [3], 1, 4, None, None),
        BlockStored([4], 3, [4], 1, None, None, None),
        BlockRemoved([1, 2], "GPU"),
        BlockRemoved([3], None),
        AllBlocksCleared(),
    ]


def test_legacy_positional_vllm() -> None:
    payload = enc([1.0, [
        ["BlockStored", [1], None, [9, 9], 2, 7, "GPU", "my-lora", [["mm", 1]], 0, "full", None, "later"],
        ["BlockStored", [2], 1, [9, 9], 2, None, "CPU", None, None, 1],
        ["BlockRemoved", [1], "GPU", 0, "later"],
        ["AllBlocksCleared", 0],
    ]])  # fmt: skip
    b = decode_batch(payload)
    assert b.events == [
        BlockStored([1], None, [9, 9], 2, 7, "GPU", "my-lora"),
        BlockStored([2], 1, [9, 9], 2, None, "CPU", None),
        BlockRemoved([1], "GPU"),
        AllBlocksCleared(),
    ]
    assert b.data_parallel_rank is None and b.epoch is None


def test_hash_forms_uint64_and_bytes() -> None:
    digest = bytes.fromhex("df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119")
    ev = {"type": "BlockStored", "block_hashes": [2**64 - 1, 2**63, 5, b"\xff" * 8, digest],
          "parent_block_hash": 2**64 - 2, "token_ids": [1], "block_size": 1}  # fmt: skip
    rm = {"type": "BlockRemoved", "block_hashes": [2**63 + 1, digest[:8]], "medium": "GPU"}
    b = decode_batch(enc([0.0, [ev, rm]]))
    assert b.events[0].block_hashes == [-1, -(2**63), 5, -1, -2360060374177730597]
    assert b.events[0].parent_block_hash == -2
    assert b.events[1].block_hashes == [-(2**63) + 1, -2360060374177730597]
    only_uint = enc([0.0, [{"type": "BlockRemoved", "block_hashes": [2**64 - 1], "medium": None}]])
    assert decode_batch(only_uint).events == [BlockRemoved([-1], None)]  # the fast path converts too
    parent_bytes = dict(ev, parent_block_hash=digest)
    assert decode_batch(enc([0.0, [parent_bytes]])).events[0].parent_block_hash == -2360060374177730597


def test_unknown_keys_key_order_and_absent_optionals() -> None:
    base = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": 9, "token_ids": [1, 2],
            "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": "l", "cache_salt": "s"}  # fmt: skip
    want = BlockStored([1], 9, [1, 2], 2, None, "GPU", "l", "s")
    rng = random.Random(7)
    for _ in range(5):
        items = list(base.items()) + [("group_idx", 3), ("extra_keys", [[1, "x"]]), ("zz", {"a": b"b"})]
        rng.shuffle(items)
        assert decode_batch(enc([0.0, [dict(items)]])).events == [want]
    sparse = {"block_size": 2, "token_ids": [1, 2], "block_hashes": [1], "type": "BlockStored"}
    assert decode_batch(enc([0.0, [sparse]])).events == [BlockStored([1], None, [1, 2], 2, None, None, None)]
    assert decode_batch(enc([0.0, [{"type": "BlockRemoved", "block_hashes": [1]}]])).events == [BlockRemoved([1], None)]
    assert decode_batch(enc([0.0, [{"type": "AllBlocksCleared", "x": 1}]])).events == [AllBlocksCleared()]


def test_batch_lengths_and_trailing_elements() -> None:
    assert decode_batch(enc([2, []])) == KVEventBatch(2.0, [], None, None)
    assert decode_batch(enc([2.5, [], 3])) == KVEventBatch(2.5, [], 3, None)
    b = decode_batch(enc([2.5, [["AllBlocksCleared"]], 3, 11, "future", {"x": [1]}]))
    assert b == KVEventBatch(2.5, [AllBlocksCleared()], 3, 11)
    assert isinstance(decode_batch(enc([2, []])).ts, float)
    assert decode_batch(bytearray(enc([1.0, []]))).ts == 1.0
    assert decode_batch(memoryview(enc([1.0, []]))).ts == 1.0


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (enc([1.0]), "at least 2"),
        (enc({"ts": 1.0}), "expected an array"),
        (enc(["x", []]), "ts"),
        (enc([1.0, {}]), "events"),
        (enc([1.0, [{"type": "BlockMoved", "block_hashes": []}]]), "unknown event type 'BlockMoved'"),
        (enc([1.0, [{"block_hashes": []}]]), "unknown event type None"),
        (enc([1.0, [["Nope"]]]), "unknown event type"),
        (enc([1.0, [5]]), "event 0"),
        (enc([1.0, [[]]]), "event 0"),
        (enc([1.0, [["AllBlocksCleared"], {"type": "BlockStored", "token_ids": [], "block_size": 1}]]), "event 1"),
        (enc([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]]), "block_hashes[0]"),
        (enc([1.0, [{"type": "BlockRemoved", "block_hashes": [b"abc"]}]]), "3 bytes"),
        (enc([1.0, [{"type": "BlockRemoved", "block_hashes": [True]}]]), "bool"),
        (enc([1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": 3}]]), "medium"),
        (
            enc([1.0, [{"type": "BlockStored", "block_hashes": [], "token_ids": ["a"], "block_size": 1}]]),
            "token_ids[0]",
        ),
        (enc([1.0, [{"type": "BlockStored", "block_hashes": [], "token_ids": [], "block_size": None}]]), "block_size"),
        (enc([1.0, [["BlockStored", [1], None]]]), "positional BlockStored"),
        (enc([1.0, [["BlockRemoved"]]]), "positional BlockRemoved"),
        (enc([1.0, [], "rank"]), "data_parallel_rank"),
        (enc([1.0, [], 0, "epoch"]), "epoch"),
        (b"", "not valid msgpack"),
        (b"\x93\xcb", "not valid msgpack"),
        (enc([1.0, []]) + b"\x00", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
    ],
)
def test_decode_errors_say_what_and_where(payload: bytes, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_batch(payload)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_non_bytes_payload() -> None:
    for bad in ("text", None, 5, [1.0, []]):
        with pytest.raises(DecodeError):
            decode_batch(bad)  # type: ignore[arg-type]


@given(st.binary(max_size=120))
def test_arbitrary_bytes_raise_only_decode_error(data: bytes) -> None:
    try:
        decode_batch(data)
    except DecodeError:
        pass


@given(obj_st, st.integers(0, 4))
def test_arbitrary_msgpack_raises_only_decode_error(obj: Any, shape: int) -> None:
    payload = enc(
        [obj, [1.0, [obj]], [1.0, obj], [1.0, [obj, obj], obj, obj], [0.5, [["BlockStored", obj, obj, obj]]]][shape]
    )
    try:
        batch = decode_batch(payload)
    except DecodeError:
        return
    assert isinstance(batch, KVEventBatch)


def test_every_truncation_and_byte_flip_raises_only_decode_error() -> None:
    payloads = golden_payloads() + [encode_batch(sample_batch()), encode_batch(sample_batch(), event_encoding="array")]
    assert len(payloads) >= 6
    for payload in payloads:
        decode_batch(payload)
        for cut in range(len(payload)):
            with pytest.raises(DecodeError):
                decode_batch(payload[:cut])
        for pos in range(len(payload)):
            for value in (0x00, 0xC1, 0xFF, payload[pos] ^ 0x01):
                try:
                    decode_batch(payload[:pos] + bytes([value]) + payload[pos + 1 :])
                except DecodeError:
                    pass


def test_deep_nesting_raises_decode_error() -> None:
    payload = b"\x92\xcb" + bytes(8) + b"\x91" * 100000 + b"\x90"
    with pytest.raises(DecodeError):
        decode_batch(payload)


# ------------------------------------------------------------------ JSON Schema


def test_committed_schema_equals_generated() -> None:
    generated = json.dumps(batch_json_schema(), indent=2) + "\n"
    assert SCHEMA_PATH.read_text() == generated, "regenerate with: kvevents schema > schemas/kvevent-batch.schema.json"
    schema = batch_json_schema()
    assert schema["$id"] and schema["title"] and schema["$schema"].endswith("2020-12/schema")
    stored = schema["$defs"]["BlockStored"]
    assert stored["required"] == ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                                  "lora_id", "medium", "lora_name"]  # fmt: skip
    assert all("description" in v for k, v in stored["properties"].items() if k != "type")


def test_encoded_batches_validate_against_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(Path(SCHEMA_PATH).read_text())
    for batch in (sample_batch(), KVEventBatch(0.0, [])):
        jsonschema.validate(msgspec.msgpack.decode(encode_batch(batch)), schema)
    bad = msgspec.msgpack.decode(bytes.fromhex(GOLDEN["wire"]["KVEventBatch_ts0_no_rank"]["msgpack_hex"]))
    with pytest.raises(jsonschema.ValidationError):  # SGLang omits medium/lora_name: not what we emit
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize(
    "call",
    [
        lambda: encode_batch(None),  # type: ignore[arg-type]
        lambda: BatchEncoder().encode(None, []),  # type: ignore[arg-type]
        lambda: encode_event(5),  # type: ignore[arg-type]
        lambda: encode_event(BlockRemoved([2**64], "GPU")),
        lambda: encode_batch(KVEventBatch(0.0, [BlockRemoved([2**64], "GPU")], None)),
        lambda: encode_event(BlockRemoved([2**64], "GPU"), event_encoding="array"),
    ],
)
def test_encoders_reject_bad_input_with_value_error(call) -> None:
    with pytest.raises(ValueError):
        call()
