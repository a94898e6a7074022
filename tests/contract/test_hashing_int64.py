"""The int64 fast path of the hash contract: same published ints as the hex path, golden values."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvevents.hashing import (
    Namespace,
    digest_chain,
    digests_to_int64,
    event_hashes,
    event_hashes_int64,
    event_seed,
    pack_tokens,
    page_hashes,
    split_pages,
    to_int64,
)

tokens_st = st.lists(st.integers(0, 2**32 - 1), max_size=40)
keys_st = st.none() | st.sampled_from(["", "a", "lora-a", "tenant-a", "é"])
ns_st = st.builds(Namespace, keys_st, keys_st)
prior_st = st.none() | st.just("") | st.binary(min_size=32, max_size=32).map(bytes.hex)


@given(tokens_st, st.integers(1, 9), ns_st, prior_st)
def test_int64_path_equals_hex_path(tokens: list[int], page_size: int, ns: Namespace, prior: str | None) -> None:
    want = [to_int64(h) for h in event_hashes(tokens, page_size, ns, prior)]
    assert event_hashes_int64(tokens, page_size, ns, prior) == want


@pytest.mark.parametrize("n_pages", [0, 1, 63, 64, 65, 128, 129, 300])
@pytest.mark.parametrize("tail", [0, 3])
def test_block_boundaries_of_the_c_level_unpacking(n_pages: int, tail: int) -> None:
    """Pages and ints are unpacked 64 at a time: every count around those blocks agrees."""
    tokens = [(i * 2654435761) % 2**32 for i in range(n_pages * 4 + tail)]
    ns = Namespace("lora-a", "tenant-a")
    assert event_hashes_int64(tokens, 4, ns) == [to_int64(h) for h in event_hashes(tokens, 4, ns)]
    pages = split_pages(pack_tokens(tokens), 4)
    assert len(pages) == n_pages + (1 if tail else 0)
    assert b"".join(pages) == pack_tokens(tokens)
    assert all(len(p) == 16 for p in pages[:n_pages]) and (not tail or len(pages[-1]) == 4 * tail)


def test_golden_published_ints(golden: dict) -> None:
    for case in golden["cases"]:
        inp, ev = case["inputs"], case["events"]
        ns = Namespace(inp["extra_key"], inp["cache_salt"])
        parents = ev["parent_event_hashes_hex"]
        prior = parents[-1] if parents else None
        got = event_hashes_int64(inp["tokens"], inp["page_size"], ns, prior)
        assert got == ev["published_block_hashes_int64"], case["id"]
        if parents:  # the parent chain itself, from the namespace seed
            want = ev["parent_events"][-1]["block_hashes"]
            assert event_hashes_int64(inp["parent_tokens"], inp["page_size"], ns)[-len(want) :] == want


def test_golden_scenario_events(golden: dict) -> None:
    """Every BlockStored of the scenarios: its block_hashes from its tokens and parent's last digest."""
    for name, steps in golden["scenarios"].items():
        ns = Namespace("lora-a", "tenant-a") if "lora-a" in name else Namespace()
        digests: dict[int, bytes] = {}  # published int -> full digest, to continue chains
        seen = 0
        for step in steps:
            for ev in step.get("events", []):
                if ev["type"] != "BlockStored":
                    continue
                parent = ev["parent_block_hash"]
                seed = event_seed(ns)
                prior = digests[parent] if parent is not None else (seed and bytes.fromhex(seed))
                chain = digest_chain(split_pages(pack_tokens(ev["token_ids"]), 4), prior)
                assert digests_to_int64(chain) == ev["block_hashes"], (name, step["step"])
                digests.update(zip(ev["block_hashes"], chain))
                seen += 1
        assert seen >= 3


def test_golden_direct_int64(golden: dict) -> None:
    for hexed, value in golden["direct"]["hash_str_to_int64"].items():
        assert digests_to_int64([bytes.fromhex(hexed)]) == [value]
    d = golden["direct"]["explicit_prior"]
    ns = Namespace(*d["namespace"])
    want = [to_int64(h) for h in d["get_hash_str_with_prior"]]
    assert event_hashes_int64(d["tokens"], len(d["tokens"]), ns, d["prior_hex"]) == want


@given(tokens_st, st.integers(1, 5), st.lists(st.integers(0, 12), max_size=4))
def test_digest_chain_continues_across_calls(tokens: list[int], page_size: int, cuts: list[int]) -> None:
    pages = split_pages(pack_tokens(tokens), page_size)
    whole = digest_chain(pages)
    assert [d.hex() for d in whole] == page_hashes(tokens, page_size)
    bounds = sorted({min(c, len(pages)) for c in cuts} | {0, len(pages)})
    parts: list[bytes] = []
    for lo, hi in zip(bounds, bounds[1:]):
        parts += digest_chain(pages[lo:hi], parts[-1] if parts else None)
    assert parts == whole
    assert digests_to_int64(whole) == [to_int64(d.hex()) for d in whole]


def test_bad_inputs_raise_valueerror() -> None:
    digest = hashlib.sha256(b"x").digest()
    for bad in (b"short", "0" * 32, digest.hex()):
        with pytest.raises(ValueError):
            digest_chain([b"\x00" * 4], bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        digest_chain(["not bytes"], digest)  # type: ignore[list-item]
    for bad_digests in ([digest, b"x" * 31], [digest[:31], digest + b"!"], ["a" * 32], b"x" * 32, [1], 5):
        with pytest.raises(ValueError):
            digests_to_int64(bad_digests)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        split_pages(b"\x00" * 5, 1)
    with pytest.raises(ValueError):
        split_pages([1, 2], 1)  # type: ignore[arg-type]
    for bad_size in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            event_hashes_int64([1], bad_size, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        event_hashes_int64([1, -1], 1, None)
    with pytest.raises(ValueError):
        event_hashes_int64([1], 1, None, "zz")
    assert digests_to_int64([]) == [] and digest_chain([]) == [] and event_hashes_int64([], 4, None) == []
