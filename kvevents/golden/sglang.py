"""Check this installation against golden vectors computed by SGLang 0.5.20 (`kvevents golden`).

Every section of the golden file is checked: cases (storage and event chains, seeds, published
ints, the BlockStored events), namespace seeds, direct vectors (incl. rejected token ids),
scenario wire bytes and the wire section (decode to the golden events; our bytes equal the golden
ones once the keys we always write and SGLang omits, `medium` / `lora_name` as nil, are inserted).
A vLLM golden file (schemas/golden/vllm-*.json) is checked by kvevents.golden.vllm instead.
"""

from __future__ import annotations

import functools
import hashlib
import json
from array import array
from typing import Any, Callable

import msgspec

from kvevents.events import BlockStored, decode_batch, encode_batch, encode_event, event_to_dict
from kvevents.golden.item import Item, short
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

__all__ = ["check_sglang_golden", "expected_event_bytes", "expected_batch_bytes"]


# ------------------------------------------------------------------ msgpack raw spans


def _header(b: bytes, i: int, fix: int, base16: int) -> tuple[int, int]:
    """(count, offset after header) for a fixmap/fixarray (`fix`) or its 16/32-bit forms."""
    t = b[i]
    if fix <= t <= fix + 0x0F:
        return t & 0x0F, i + 1
    if t == base16:
        return int.from_bytes(b[i + 1 : i + 3], "big"), i + 3
    if t == base16 + 1:
        return int.from_bytes(b[i + 1 : i + 5], "big"), i + 5
    raise ValueError(f"byte {i}: 0x{t:02x} is not the expected msgpack container")


_FIXED = {0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,
          0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}  # fmt: skip
_SIZED = {0xD9: 1, 0xC4: 1, 0xDA: 2, 0xC5: 2, 0xDB: 4, 0xC6: 4}
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}


def _skip(b: bytes, i: int) -> int:
    """Offset just past the msgpack value starting at i."""
    t = b[i]
    if t <= 0x7F or t >= 0xE0 or t in (0xC0, 0xC2, 0xC3):
        return i + 1
    if 0xA0 <= t <= 0xBF:
        return i + 1 + (t & 0x1F)
    if t in _FIXED:
        return i + 1 + _FIXED[t]
    if t in _SIZED:
        w = _SIZED[t]
        return i + 1 + w + int.from_bytes(b[i + 1 : i + 1 + w], "big")
    if t in _EXT:
        w = _EXT[t]
        return i + 2 + w + int.from_bytes(b[i + 1 : i + 1 + w], "big")
    if 0x80 <= t <= 0x8F or t in (0xDE, 0xDF):
        n, i = _header(b, i, 0x80, 0xDE)
        n *= 2
    elif 0x90 <= t <= 0x9F or t in (0xDC, 0xDD):
        n, i = _header(b, i, 0x90, 0xDC)
    else:
        raise ValueError(f"byte {i}: 0x{t:02x} is not valid msgpack")
    for _ in range(n):
        i = _skip(b, i)
    return i


def _map_header(n: int) -> bytes:
    return bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")


def _fixstr(s: str) -> bytes:
    raw = s.encode()
    return bytes([0xA0 | len(raw)]) + raw


_STORED_ORDER = ["type", *BlockStored.__struct_fields__]
_N_REQUIRED = len(BlockStored.__struct_fields__) - len(BlockStored.__struct_defaults__)
_STORED_REQUIRED = {"type", *BlockStored.__struct_fields__[:_N_REQUIRED]}  # always written, even nil


def expected_event_bytes(golden: bytes) -> bytes:
    """Our encoding of a golden event: the golden bytes, plus the always-written keys it lacks as nil.

    Raises ValueError when the field sets cannot agree (a golden key we do not write, another order).
    """
    n, i = _header(golden, 0, 0x80, 0xDE)
    entries: dict[str, bytes] = {}
    kind: Any = None
    for _ in range(n):
        k_end = _skip(golden, i)
        v_end = _skip(golden, k_end)
        key = msgspec.msgpack.decode(golden[i:k_end])
        if key == "type":
            kind = msgspec.msgpack.decode(golden[k_end:v_end])
        entries[str(key)] = golden[i:v_end]
        i = v_end
    if i != len(golden):
        raise ValueError(f"{len(golden) - i} trailing bytes after the event map")
    if kind != "BlockStored":
        return golden  # BlockRemoved / AllBlocksCleared: we write exactly the same keys
    unknown = [k for k in entries if k not in _STORED_ORDER]
    if unknown:
        raise ValueError(f"golden BlockStored has keys we do not write: {unknown}")
    if list(entries) != [k for k in _STORED_ORDER if k in entries]:
        raise ValueError(f"golden key order {list(entries)} differs from ours")
    parts = [entries[k] if k in entries else _fixstr(k) + b"\xc0" for k in _STORED_ORDER
             if k in entries or k in _STORED_REQUIRED]  # fmt: skip
    return _map_header(len(parts)) + b"".join(parts)


def expected_batch_bytes(golden: bytes) -> bytes:
    """Our encoding of a golden batch: envelope bytes unchanged, each event per expected_event_bytes."""
    _, i = _header(golden, 0, 0x90, 0xDC)
    head = golden[:i]
    ts_end = _skip(golden, i)
    m, j = _header(golden, ts_end, 0x90, 0xDC)
    out = [head, golden[i:ts_end], golden[ts_end:j]]
    for _ in range(m):
        end = _skip(golden, j)
        out.append(expected_event_bytes(golden[j:end]))
        j = end
    out.append(golden[j:])
    return b"".join(out)


# ------------------------------------------------------------------ comparisons


def _event_diffs(ev: Any, want: dict[str, Any]) -> list[str]:
    """Field-by-field differences between our event and a golden event dict (absent => None)."""
    ours = event_to_dict(ev)
    diffs = [f"golden key {k!r} is not an event field" for k in want if k not in ours]
    for k, v in ours.items():
        w = want.get(k)
        if v != w or type(v) is not type(w):
            diffs.append(f"{k}: got {short(v)}, want {short(w)}")
    return diffs


def _expect_events(item: Item, what: str, got: list[Any], want: list[dict[str, Any]]) -> None:
    item.expect(f"{what} count", len(got), len(want))
    for n, (ev, w) in enumerate(zip(got, want)):
        diffs = _event_diffs(ev, w)
        item.expect(f"{what}[{n}]", diffs, [])


def _wrap_event(raw: bytes) -> bytes:
    """A one-event batch `[0.0, [event], nil]` around raw event bytes, for decode_batch."""
    return b"\x93\xcb" + bytes(8) + b"\x91" + raw + b"\xc0"


# ------------------------------------------------------------------ sections


def _case(case: dict[str, Any]) -> Item:
    item = Item("cases", str(case.get("id")))

    def run() -> None:
        inp = case["inputs"]
        ps = inp["page_size"]
        ns = Namespace(inp["extra_key"], inp["cache_salt"])
        norm = case.get("radix_key_after_normalisation")
        if norm is not None:
            item.expect("normalised namespace", [ns.extra_key, ns.cache_salt], [norm["extra_key"], norm["cache_salt"]])
        parent, tokens = inp.get("parent_tokens"), inp["tokens"]
        st, ev = case["storage"], case["events"]
        item.expect("storage seed", storage_seed(ns), st["namespace_seed_hex_used"])
        item.expect("storage seed (raw inputs)", storage_seed(ns), st["namespace_seed_hex_from_raw_inputs"])
        seed_hex = ev.get("event_chain_seed_hex")
        if seed_hex is None or len(seed_hex) == 64:  # otherwise "n/a (child continues ...)"
            item.expect("event seed", event_seed(ns), seed_hex)
        s_prior = e_prior = None
        if parent:
            p_st = storage_hashes(parent, ps, ns)
            p_ev = event_hashes(parent, ps, ns)
            item.expect("parent storage hashes", p_st, st["parent_storage_hashes_hex"])
            item.expect("parent event hashes", p_ev, ev["parent_event_hashes_hex"])
            s_prior, e_prior = p_st[-1], p_ev[-1]
            item.expect("whole storage chain", storage_hashes(parent + tokens, ps, ns), p_st + st["storage_hashes_hex"])
            item.expect("whole event chain", event_hashes(parent + tokens, ps, ns), p_ev + ev["event_hashes_hex"])
        s_hex = storage_hashes(tokens, ps, ns, s_prior)
        e_hex = event_hashes(tokens, ps, ns, e_prior)
        ints = [to_int64(h) for h in e_hex]
        item.expect("storage hashes", s_hex, st["storage_hashes_hex"])
        item.expect("event hashes", e_hex, ev["event_hashes_hex"])
        item.expect("published int64", ints, ev["published_block_hashes_int64"])
        item.expect("hex16", [int64_to_hex16(v) for v in ints], ev["published_block_hashes_hex16_twos_complement"])
        if ev.get("parent_events"):
            p_ints = [to_int64(h) for h in event_hashes(parent, ps, ns)]
            mine = [BlockStored(p_ints, None, list(parent), ps, None, "GPU", None, ns.cache_salt)]
            _expect_events(item, "parent_events", mine, ev["parent_events"])
        parent_int = to_int64(e_prior) if e_prior else None
        mine = [BlockStored(ints, parent_int, list(tokens), ps, None, "GPU", None, ns.cache_salt)]
        _expect_events(item, "block_stored_events", mine, ev["block_stored_events"])

    item.run("case", run)
    return item


def _expect_seed(item: Item, key: str, want: Any) -> None:
    item.expect("storage seed", storage_seed(Namespace(*json.loads(key))), want)


def _seeds(seeds: dict[str, Any]) -> list[Item]:
    items = []
    for key, want in seeds.items():
        item = Item("namespace seeds", key)
        item.run("seed", functools.partial(_expect_seed, item, key, want))
        items.append(item)
    return items


def _whole(tokens: list[int]) -> str:
    """SGLang's get_hash_str without a page size: one digest over the whole sequence (even empty)."""
    return hashlib.sha256(pack_tokens(tokens)).hexdigest()


def _rejects(item: Item, what: str, tokens: Any, bad: int) -> None:
    item.checks += 1
    try:
        page_hashes(tokens, 4)
    except ValueError as exc:
        msg = str(exc)
        if str(bad) not in msg or "position 1" not in msg:
            item.failures.append(f"{what}: error does not name the id and position: {msg}")
        return
    item.failures.append(f"{what}: token id {bad} was accepted")


def _direct(d: dict[str, Any]) -> list[Item]:
    checks: dict[str, Callable[[Item, Any], None]] = {
        "get_hash_str_empty_no_page_size": lambda it, w: it.expect("sha256 of no tokens", _whole([]), w),
        "get_hash_str_[1,2,3]_no_page_size": lambda it, w: it.expect("one page", page_hashes([1, 2, 3], 3), [w]),
        "get_hash_str_[1,2,3]_page_size_4": lambda it, w: it.expect("chain", page_hashes([1, 2, 3], 4), w),
        "get_hash_str_empty_page_size_4": lambda it, w: it.expect("chain", page_hashes([], 4), w),
        "partial_page_plain_ps4_tokens_5..10": lambda it, w: it.expect("chain", page_hashes(range(5, 11), 4), w),
    }

    def explicit_prior(it: Item, w: dict[str, Any]) -> None:
        ns = Namespace(*w["namespace"])
        it.expect("storage", storage_hashes(w["tokens"], 4, ns, w["prior_hex"]), w["get_storage_hash_str_with_prior"])
        it.expect("event", event_hashes(w["tokens"], 4, ns, w["prior_hex"]), w["get_hash_str_with_prior"])
        it.expect("plain", page_hashes(w["tokens"], 4, w["prior_hex"]), w["get_hash_str_with_prior"])

    def u32_max(it: Item, w: dict[str, Any]) -> None:
        it.expect("list", page_hashes([2**32 - 1], 4), w["list"])
        it.expect("array('q')", page_hashes(array("q", [2**32 - 1]), 4), w["array_q"])

    def rejected(value: int) -> Callable[[Item, Any], None]:
        def check(it: Item, w: Any) -> None:
            _rejects(it, "list", [1, value], value)
            _rejects(it, "array('q')", array("q", [1, value]), value)

        return check

    def to_int(it: Item, w: dict[str, int]) -> None:
        for hex_hash, value in w.items():
            it.expect(f"to_int64({hex_hash[:16]}..)", to_int64(hex_hash), value)
            it.expect(f"int64_to_hex16({value})", int64_to_hex16(value), hex_hash[:16])

    checks.update(explicit_prior=explicit_prior, token_u32_max=u32_max, hash_str_to_int64=to_int,
                  token_u32_max_plus_1=rejected(2**32), token_negative=rejected(-1))  # fmt: skip
    items = []
    for key, want in d.items():
        item = Item("direct", key)
        fn = checks.get(key)
        if fn is None:
            item.failures.append("unknown direct vector (this checker does not know it)")
        else:
            item.run(key, functools.partial(fn, item, want))
        items.append(item)
    return items


def _scenario(name: str, steps: list[dict[str, Any]]) -> Item:
    item = Item("scenarios", name)

    def run() -> None:
        last_events: list[dict[str, Any]] = []
        for step in steps:
            wire = next((k for k in step if k.startswith("wire_") and k.endswith("_msgpack_hex")), None)
            if wire is not None:
                raw = bytes.fromhex(step[wire])
                batch = decode_batch(raw)
                want = step.get("wire_decoded_generic")
                if want is not None:
                    item.expect("wire ts", batch.ts, want[0])
                    item.expect("wire rank", batch.data_parallel_rank, want[2])
                    _expect_events(item, "wire events", batch.events, want[1])
                _expect_events(item, "wire vs step events", batch.events, last_events)
                item.expect("our wire bytes", encode_batch(batch).hex(), expected_batch_bytes(raw).hex())
                continue
            last_events = step.get("events", [])
            for ev in last_events:
                if ev.get("type") != "BlockStored":
                    continue
                ns = Namespace(None, ev.get("cache_salt"))
                bs = ev["block_size"]
                if ev["parent_block_hash"] is None:
                    ints = [to_int64(h) for h in event_hashes(ev["token_ids"], bs, ns)]
                    item.expect(f"{step['step']}: hashes from token_ids", ints, ev["block_hashes"])
                elif "tokens" in step:
                    ints = [to_int64(h) for h in event_hashes(step["tokens"], bs, ns)]
                    k = len(ev["block_hashes"])
                    item.expect(f"{step['step']}: tail of the chain", ints[-k:], ev["block_hashes"])
                    item.expect(f"{step['step']}: parent", ints[-k - 1], ev["parent_block_hash"])

    item.run("scenario", run)
    return item


def _wire(wire: dict[str, Any]) -> list[Item]:
    items = []
    for key, entry in wire.items():
        item = Item("wire", key)
        if key == "typed_decoder_round_trip_ok":

            def run_types(item: Item = item, entry: Any = entry) -> None:
                batch = decode_batch(bytes.fromhex(wire["KVEventBatch_ts0_no_rank"]["msgpack_hex"]))
                item.expect("decoded types", [type(e).__name__ for e in batch.events], entry)

            item.run(key, run_types)
        elif isinstance(entry, dict) and "msgpack_hex" in entry:

            def run_entry(item: Item = item, entry: dict[str, Any] = entry) -> None:
                raw = bytes.fromhex(entry["msgpack_hex"])
                want = entry["decoded"]
                if isinstance(want, list):  # a whole batch
                    batch = decode_batch(raw)
                    item.expect("ts", batch.ts, want[0])
                    item.expect("rank", batch.data_parallel_rank, want[2] if len(want) > 2 else None)
                    _expect_events(item, "events", batch.events, want[1])
                    item.expect("our bytes", encode_batch(batch).hex(), expected_batch_bytes(raw).hex())
                else:
                    batch = decode_batch(_wrap_event(raw))
                    _expect_events(item, "event", batch.events, [want])
                    if batch.events:
                        ours = encode_event(batch.events[0])
                        item.expect("our bytes", ours.hex(), expected_event_bytes(raw).hex())

            item.run(key, run_entry)
        else:
            item.failures.append("unknown wire entry (this checker does not know it)")
        items.append(item)
    return items


#: The sections of an SGLang (contract) golden file, in the order they are checked.
SGLANG_SECTIONS = ("cases", "namespace_seeds_storage", "direct", "scenarios", "wire")


def check_sglang_golden(golden: dict[str, Any]) -> list[Item]:
    """Check every section of an SGLang golden file; one Item per golden item, in file order."""
    items: list[Item] = []
    sections = {
        "cases": lambda v: [_case(c) for c in v],
        "namespace_seeds_storage": _seeds,
        "direct": _direct,
        "scenarios": lambda v: [_scenario(k, s) for k, s in v.items()],
        "wire": _wire,
    }
    assert tuple(sections) == SGLANG_SECTIONS
    for name, fn in sections.items():
        if name not in golden:
            item = Item(name, "(section)")
            item.failures.append("section missing from the golden file")
            items.append(item)
            continue
        try:
            items.extend(fn(golden[name]))
        except Exception as exc:  # noqa: BLE001 - a malformed section is a failure, not a crash
            item = Item(name, "(section)")
            item.failures.append(f"malformed section: {type(exc).__name__}: {exc}")
            items.append(item)
    return items
