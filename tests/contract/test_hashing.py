"""The hash contract (the contract, schemas/README.md sections "Namespace" to "The published integer"): namespaces, chains, seeds, int64 form, inputs and properties."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from array import array

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kvevents.hashing import (
    DEFAULT_NAMESPACE,
    Namespace,
    event_hashes,
    event_seed,
    hash_chains,
    int64_to_hex16,
    pack_tokens,
    page_hashes,
    storage_hashes,
    storage_seed,
    to_int64,
)

U32 = 2**32 - 1
tokens_st = st.lists(st.integers(0, U32), max_size=40)
small_tokens_st = st.lists(st.integers(0, 300), max_size=40)
keys_st = st.none() | st.sampled_from(["", "a", "b", "ab", "lora-a", "\x00", "é"]) | st.text(max_size=6)
ns_st = st.builds(Namespace, keys_st, keys_st)
NAMESPACES = [
    Namespace(),
    Namespace("lora-a"),
    Namespace(""),
    Namespace(None, "tenant-a"),
    Namespace("lora-a", "tenant-a"),
    Namespace("", "tenant-a"),
]


def reference_chain(tokens: list[int], page_size: int, prior: bytes | None) -> list[str]:
    """A second, deliberately naive implementation of the contract, "The page hash" (struct per token)."""
    out = []
    for i in range(0, len(tokens), page_size):
        data = (prior or b"") + b"".join(struct.pack("<I", t) for t in tokens[i : i + page_size])
        prior = hashlib.sha256(data).digest()
        out.append(prior.hex())
    return out


def reference_storage_seed(extra_key: str | None, cache_salt: str | None) -> str | None:
    if cache_salt == "":
        cache_salt = None
    if extra_key is None and cache_salt is None:
        return None
    data = b"sglang-cache-namespace-v1"
    for value in (extra_key, cache_salt):
        if value is None:
            data += b"\x00"
        else:
            raw = value.encode("utf-8")
            data += b"\x01" + struct.pack("<Q", len(raw)) + raw
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ namespace


def test_namespace_normalisation_and_identity() -> None:
    assert Namespace(None, "") == Namespace() == DEFAULT_NAMESPACE
    assert Namespace("", None) != Namespace()
    assert Namespace("").extra_key == ""
    assert Namespace().is_default and not Namespace("").is_default and not Namespace(None, "s").is_default
    assert len({Namespace("a", "b"), Namespace("a", "b"), Namespace("a", "")}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        Namespace().extra_key = "x"  # type: ignore[misc]
    with pytest.raises(ValueError):
        Namespace(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Namespace(None, b"salt")  # type: ignore[arg-type]


def test_seeds_of_empty_strings() -> None:
    assert storage_seed(Namespace()) is None and event_seed(Namespace()) is None
    assert storage_seed(None) is None
    assert storage_seed(Namespace("")) == reference_storage_seed("", None) is not None
    assert event_seed(Namespace("")) is None  # extra_key never seeds the event chain
    assert event_seed(Namespace(None, "s")) == hashlib.sha256(b"sglang-cache-salt-v1\x00s").hexdigest()
    with pytest.raises(ValueError):
        storage_seed(("a", "b"))  # type: ignore[arg-type]


# ------------------------------------------------------------------ page chain


@given(tokens_st, st.integers(1, 9))
def test_page_hashes_match_reference(tokens: list[int], page_size: int) -> None:
    assert page_hashes(tokens, page_size) == reference_chain(tokens, page_size, None)


def test_partial_page_is_not_padded() -> None:
    (last,) = page_hashes([9], 4, "00" * 32)
    assert last == hashlib.sha256(bytes(32) + struct.pack("<I", 9)).hexdigest()
    assert page_hashes([1, 2, 3, 4, 5], 4)[1] != page_hashes([1, 2, 3, 4, 5, 0, 0, 0], 4)[1]


def test_prior_forms() -> None:
    prior = page_hashes([1, 2], 2)[0]
    assert page_hashes([3], 1, "") == page_hashes([3], 1, None)
    assert page_hashes([3], 1, prior) == reference_chain([3], 1, bytes.fromhex(prior))
    assert page_hashes([3], 1, prior.upper()) == page_hashes([3], 1, prior)
    for bad in ("zz", prior[:-1], prior + "0", "g" * 64, " " * 64, "00 " * 21 + "0", 5, b"\x00" * 32):
        with pytest.raises(ValueError):
            page_hashes([3], 1, bad)  # type: ignore[arg-type]
    assert page_hashes([], 1, prior) == []


@pytest.mark.parametrize("page_size", [0, -1, 1.5, True, "4", None])
def test_bad_page_size(page_size: object) -> None:
    for fn in (
        lambda: page_hashes([1], page_size),  # type: ignore[arg-type]
        lambda: storage_hashes([1], page_size, Namespace("a")),  # type: ignore[arg-type]
        lambda: event_hashes([1], page_size, Namespace("a")),  # type: ignore[arg-type]
        lambda: hash_chains([1], page_size, Namespace("a")),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError):
            fn()


# ------------------------------------------------------------------ inputs


def test_input_containers_agree() -> None:
    tokens = [0, 1, 151643, 2**31 - 1, U32, 7, 8]
    want = page_hashes(tokens, 3)
    inputs = [
        tuple(tokens),
        array("I", tokens),
        array("L", tokens),
        array("q", tokens),
        array("Q", tokens),
        np.array(tokens, dtype=np.uint32),
        np.array(tokens, dtype=np.int64),
        np.array(tokens, dtype=np.uint64),
        np.array(tokens, dtype=object),
        np.array(tokens, dtype=">u4"),
        iter(tokens),
        (t for t in tokens),
        [np.int64(t) for t in tokens],
    ]
    for value in inputs:
        assert page_hashes(value, 3) == want, type(value)
    assert page_hashes(range(5, 11), 4) == page_hashes(list(range(5, 11)), 4)
    assert page_hashes(np.array([1, 2, 3], dtype=np.int8), 2) == page_hashes([1, 2, 3], 2)
    assert pack_tokens(np.array([[1, 2], [3, 4]])) == pack_tokens([1, 2, 3, 4])


@pytest.mark.parametrize("value", [b"\x01\x02", "abc", 5, None, [1.5], [1.0], ["1"], [None], np.array([1.0]), [[1]]])
def test_non_integer_tokens_rejected(value: object) -> None:
    with pytest.raises(ValueError):
        page_hashes(value, 1)  # type: ignore[arg-type]


def test_huge_ids_in_numpy_object_arrays_rejected() -> None:
    for bad in (2**64, -(2**70)):
        with pytest.raises(ValueError, match=f"{bad} at position 1"):
            page_hashes(np.array([1, bad, 2]), 1)


def test_error_names_id_and_position_for_non_integers() -> None:
    with pytest.raises(ValueError, match=r"'x' at position 2"):
        page_hashes([1, 2, "x"], 1)  # type: ignore[list-item]


# ------------------------------------------------------------------ storage and event chains


@given(small_tokens_st, st.integers(1, 6), ns_st)
def test_chains_from_seeds(tokens: list[int], page_size: int, ns: Namespace) -> None:
    s_seed, e_seed = storage_seed(ns), event_seed(ns)
    assert s_seed == reference_storage_seed(ns.extra_key, ns.cache_salt)
    s_prior = bytes.fromhex(s_seed) if s_seed else None
    e_prior = bytes.fromhex(e_seed) if e_seed else None
    assert storage_hashes(tokens, page_size, ns) == reference_chain(tokens, page_size, s_prior)
    assert event_hashes(tokens, page_size, ns) == reference_chain(tokens, page_size, e_prior)


@given(small_tokens_st, st.integers(1, 6), keys_st, keys_st)
def test_extra_key_never_changes_event_hashes(
    tokens: list[int], page_size: int, extra: str | None, salt: str | None
) -> None:
    with_key = event_hashes(tokens, page_size, Namespace(extra, salt))
    assert with_key == event_hashes(tokens, page_size, Namespace(None, salt))
    assert event_seed(Namespace(extra, salt)) == event_seed(Namespace(None, salt))
    if tokens and extra is not None:  # ... while storage hashes always move
        assert storage_hashes(tokens, page_size, Namespace(extra, salt)) != storage_hashes(
            tokens, page_size, Namespace(None, salt)
        )


def test_default_namespace_chains_coincide() -> None:
    tokens = list(range(40))
    assert storage_hashes(tokens, 4, Namespace()) == event_hashes(tokens, 4, Namespace()) == page_hashes(tokens, 4)
    assert storage_hashes(tokens, 4, None) == page_hashes(tokens, 4)
    salt_only = Namespace(None, "t")
    assert storage_hashes(tokens, 4, salt_only) != event_hashes(tokens, 4, salt_only)


@given(
    st.lists(st.integers(0, U32), min_size=1, max_size=48),
    st.integers(1, 5),
    st.lists(st.integers(0, 12), max_size=4),
    st.sampled_from(NAMESPACES),
)
def test_chunked_hashing_equals_whole_chain(tokens: list[int], page_size: int, cuts: list[int], ns: Namespace) -> None:
    """Hashing a few pages at a time, continuing from the last hash, gives the whole chain."""
    n_pages = -(-len(tokens) // page_size)
    bounds = sorted({min(c, n_pages) * page_size for c in cuts} | {0, len(tokens)})
    for chain in (storage_hashes, event_hashes):
        whole = chain(tokens, page_size, ns)
        pieces: list[str] = []
        for lo, hi in zip(bounds, bounds[1:]):
            pieces += chain(tokens[lo:hi], page_size, ns, pieces[-1] if pieces else None)
        assert pieces == whole
    whole_s, whole_e = hash_chains(tokens, page_size, ns)
    s_parts: list[str] = []
    e_parts: list[str] = []
    for lo, hi in zip(bounds, bounds[1:]):
        s, e = hash_chains(
            tokens[lo:hi], page_size, ns, s_parts[-1] if s_parts else None, e_parts[-1] if e_parts else ""
        )
        s_parts += s
        e_parts += e
    assert (s_parts, e_parts) == (whole_s, whole_e)


@given(small_tokens_st, st.integers(1, 6), ns_st, st.booleans())
def test_hash_chains_equals_separate_calls(tokens: list[int], page_size: int, ns: Namespace, with_prior: bool) -> None:
    s_prior = page_hashes([1], 1)[0] if with_prior else None
    e_prior = page_hashes([2], 1)[0] if with_prior else None
    s, e = hash_chains(tokens, page_size, ns, s_prior, e_prior)
    assert s == storage_hashes(tokens, page_size, ns, s_prior)
    assert e == event_hashes(tokens, page_size, ns, e_prior)
    s.append("x")
    assert len(e) == len(s) - 1  # independent lists even when the chains coincide


# ------------------------------------------------------------------ seed framing


@given(keys_st, keys_st, keys_st, keys_st)
def test_storage_seed_framing_is_injective(a1: str | None, b1: str | None, a2: str | None, b2: str | None) -> None:
    n1, n2 = Namespace(a1, b1), Namespace(a2, b2)
    assume(n1 != n2)
    assert storage_seed(n1) != storage_seed(n2)


def test_storage_seed_ambiguous_concatenations() -> None:
    pairs = [("a", "bc"), ("ab", "c"), ("abc", None), (None, "abc"), ("", "abc"), ("abc", ""), ("", None),
             (None, None), ("", "x"), ("\x00", None), (None, "\x00"), ("\x01", None), ("a\x00", "b")]  # fmt: skip
    seeds = [storage_seed(Namespace(k, s)) for k, s in pairs]
    assert seeds[5] == seeds[2]  # ("abc", "") normalises to ("abc", None) ...
    del seeds[5], pairs[5]
    assert storage_seed(Namespace("", None)) is not None  # ... but an extra_key of "" is a namespace
    assert len(set(seeds)) == len(seeds), pairs
    assert storage_seed(Namespace("", None)) != storage_seed(Namespace(None, None))


@given(st.text(max_size=8), st.text(max_size=8))
def test_event_seed_depends_on_salt_only(s1: str, s2: str) -> None:
    n1, n2 = Namespace("k1", s1), Namespace(None, s2)
    assert (event_seed(n1) == event_seed(n2)) == ((s1 or None) == (s2 or None))


# ------------------------------------------------------------------ int64 form


@given(st.binary(min_size=32, max_size=32))
def test_int64_form(digest: bytes) -> None:
    value = to_int64(digest.hex())
    assert -(2**63) <= value < 2**63
    assert value == struct.unpack(">q", digest[:8])[0]
    assert int64_to_hex16(value) == digest[:8].hex()


@pytest.mark.parametrize("bad", ["", "abc", "zz" * 16, None, 5])
def test_to_int64_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        to_int64(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1])
def test_int64_to_hex16_rejects(bad: int) -> None:
    with pytest.raises(ValueError):
        int64_to_hex16(bad)


# ---------------------------------------------------------------- input edge cases (review findings)


@pytest.mark.parametrize("field", ["extra_key", "cache_salt"])
def test_namespace_rejects_text_that_is_not_utf8(field: str) -> None:
    with pytest.raises(ValueError, match=f"Namespace.{field} is not valid UTF-8"):
        Namespace(**{field: "ok\udcff"})


def test_to_int64_rejects_whitespace_inside_the_first_16_chars() -> None:
    with pytest.raises(ValueError, match="not a hex digest"):
        to_int64("0000 0000 000001" + "0" * 48)
    assert to_int64("0000000000000001" + "0" * 48) == 1


@pytest.mark.parametrize("bad", [{1, 2, 3}, frozenset({1}), {1: 2}])
def test_unordered_token_containers_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="ordered sequence"):
        page_hashes(bad, 4)  # type: ignore[arg-type]


def test_scalar_numpy_array_is_rejected() -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match="scalar"):
        page_hashes(np.array(5), 4)
