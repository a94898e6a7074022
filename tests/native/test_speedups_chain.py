"""The compiled page chain (kvevents.native._speedups) against the pure-Python chain and the golden vectors.

Differential: every public hashing function gives the same result with the fast path on and off
(and with the portable C SHA-256 instead of SHA-NI); malformed input raises ValueError, never
crashes. Skipped where the extension is not built (the pure-Python path is the whole suite then).
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvevents import hashing, native
from kvevents.golden import check_golden
from kvevents.hashing import Namespace

pytestmark = pytest.mark.skipif(
    not native.active(), reason="kvevents.native._speedups not built, or KVEVENTS_PURE_PYTHON set"
)

TOKENS = st.lists(st.integers(0, 2**32 - 1), max_size=300)
SIZES = st.integers(1, 70)
PRIORS = st.one_of(st.none(), st.binary(min_size=32, max_size=32).map(bytes.hex))
TEXT = st.one_of(st.none(), st.text(max_size=8))


def _all_paths(fn):
    """fn() with the C path (SHA-NI when the CPU has it), the portable C SHA-256, and pure Python."""
    fast = fn()
    with native.portable_sha():
        portable = fn()
    with native.python_only():
        slow = fn()
    return fast, portable, slow


def test_describe_names_the_path():
    assert native.active()
    assert native.describe().startswith("speedups: C extension (SHA-256 ")
    with native.python_only():
        assert not native.active()


@settings(max_examples=60, derandomize=True, deadline=None)
@given(TOKENS, SIZES, PRIORS, TEXT, TEXT)
def test_every_public_hashing_function_matches_the_python_chain(tokens, page_size, prior, extra, salt):
    ns = Namespace(extra, salt)

    def run():
        return (
            hashing.page_hashes(tokens, page_size, prior),
            hashing.storage_hashes(tokens, page_size, ns, prior),
            hashing.event_hashes(tokens, page_size, ns, prior),
            hashing.hash_chains(tokens, page_size, ns, prior, prior),
            hashing.event_hashes_int64(tokens, page_size, ns, prior),
            hashing.packed_chain(
                hashing.pack_tokens(tokens), page_size, None if prior is None else bytes.fromhex(prior)
            ),
            hashing.digest_chain(hashing.split_pages(hashing.pack_tokens(tokens), page_size)),
            hashing.whole_pages_chain(tokens, page_size, None if prior is None else bytes.fromhex(prior)),
            hashing.packed_chain_int64(
                hashing.pack_tokens(tokens), page_size, None if prior is None else bytes.fromhex(prior)
            ),
            hashing.whole_pages_int64(tokens, page_size, None if prior is None else bytes.fromhex(prior)),
        )

    fast, portable, slow = _all_paths(run)
    assert fast == portable == slow


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=700), st.one_of(st.none(), st.binary(min_size=32, max_size=32)))
def test_16_token_chains_in_registers_equal_the_python_chain(tokens, prior):
    """16-token pages run one SHA-NI loop that keeps the digest in registers between links (after a
    first link without prior, before a partial last page): digests and published ints as Python's."""
    packed = hashing.pack_tokens(tokens)

    def run():
        return (
            hashing.packed_chain(packed, 16, prior),
            hashing.packed_chain_int64(packed, 16, prior),
            hashing.whole_pages_int64(tokens, 16, prior),
            hashing.whole_pages_chain(tokens, 16, prior),
        )

    fast, portable, slow = _all_paths(run)
    assert fast == portable == slow
    assert fast[1] == native.digests_int64(fast[0])


@settings(max_examples=40, derandomize=True, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=20), st.one_of(st.none(), st.binary(min_size=32, max_size=32)))
def test_chain_of_any_page_lengths_equals_hashlib(pages, prior):
    """Page byte strings of every length (padding: 55, 56, 63, 64, 119, 120 bytes and beyond)."""
    want, p = [], prior
    for page in pages:
        p = hashlib.sha256(page if p is None else p + page).digest()
        want.append(p)
    assert native.chain_pages(pages, prior) == want
    with native.portable_sha():
        assert native.chain_pages(pages, prior) == want


def test_padding_boundaries_against_hashlib():
    for n in list(range(0, 200)) + [1000, 4096, 65536 + 7]:
        data = bytes((i * 7 + n) % 256 for i in range(n))
        for prior in (None, b"\x01" * 32):
            want = hashlib.sha256(data if prior is None else prior + data).digest()
            assert native.chain_pages([data], prior) == [want]
            with native.portable_sha():
                assert native.chain_pages([data], prior) == [want]


def test_golden_vectors_pass_on_every_path(golden):
    for label, ctx in (("sha-ni", None), ("portable", native.portable_sha()), ("python", native.python_only())):
        if ctx is None:
            items = check_golden(golden)
        else:
            with ctx:
                items = check_golden(golden)
        bad = [it.detail() for it in items if not it.ok]
        assert items and not bad, (label, bad)


def test_digests_int64_is_the_published_int():
    digests = native.chain_packed(hashing.pack_tokens(range(64)), 4, None)
    import numpy as np

    ints = np.frombuffer(native.digests_int64(digests), np.int64).tolist()
    assert ints == hashing.packed_to_int64(digests)


@pytest.mark.parametrize(
    "call",
    [
        lambda: native.chain_packed(b"\x00" * 8, 0, None),
        lambda: native.chain_packed(b"\x00" * 8, -3, None),
        lambda: native.chain_packed(b"\x00" * 8, 1, b"short"),
        lambda: native.chain_packed("text", 1, None),
        lambda: native.chain_pages([b"a"], b"x" * 31),
        lambda: native.chain_pages([b"a"], "0" * 32),
        lambda: native.digests_int64(b"\x00" * 33),
        lambda: native.digests_int64(3),
    ],
)
def test_malformed_chain_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_bad_pages_raise_what_the_python_chain_raises():
    for pages in ([b"a", "b"], [b"a", 3], ["a"], [None]):
        with pytest.raises(TypeError):
            native.chain_pages(pages, None)
        with pytest.raises(ValueError):
            hashing.digest_chain(pages)
        with native.python_only(), pytest.raises(ValueError):
            hashing.digest_chain(pages)


@pytest.mark.parametrize("tokens", [[1, -1], [2**32], [0, 1.0], [True, 5], [2**100], [1, None], [1, "2"]])
def test_packing_refuses_what_the_python_path_refuses(tokens):
    def run():
        try:
            return hashing.pack_tokens(tokens), hashing.whole_pages_chain(tokens, 1)
        except ValueError as exc:
            return str(exc)

    fast = run()
    with native.python_only():
        assert fast == run()


def test_huge_page_sizes_give_the_python_result():
    for ps in (2**20, 2**20 + 1, 2**50, 2**70):
        fast = (hashing.packed_chain(b"\x01" * 12, ps), hashing.whole_pages_chain([1, 2, 3], ps))
        with native.python_only():
            assert fast == (hashing.packed_chain(b"\x01" * 12, ps), hashing.whole_pages_chain([1, 2, 3], ps))
    with pytest.raises(ValueError):
        native.chain_packed(b"\x00" * 8, 2**50, None)
    for bad in (2**70, 0, -1, True, 1.0, "16"):
        with pytest.raises(ValueError):
            native.chain_list([1], bad, None)
        with pytest.raises(ValueError):
            native.chain_packed(b"", bad, None)
