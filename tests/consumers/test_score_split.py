"""The /score body's token-array splitter (issue 28 part 2): the compiled `split_json_tokens` finds
the top-level "tokens" array and packs its ids with the GIL let go, so a 16 MB body no longer stalls
the router's event loop. It must agree with its pure-Python twin, find exactly the array JSON says
is the value of "tokens" (never one inside a string or a nested object), and let other threads run."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvevents import native
from kvevents.consumers.service.score_body import decode_packed, split_json_tokens_py
from kvevents.hashing import pack_tokens

compiled = pytest.mark.skipif(
    not native.active(), reason="kvevents.native._speedups not built, or KVEVENTS_PURE_PYTHON set"
)

BODIES = [
    b'{"tokens":[1,2]}',
    b' {\n "tokens" : [ 1 ,\t2 ] } \r\n',
    b'{"tokens":[]}',
    b'{"cache_salt":"a]b[","tokens":[7],"lora_name":"x"}',
    b'{"lora_name":"\\"tokens\\":[9]","tokens":[1]}',
    b'{"x":{"tokens":[5]},"tokens":[6]}',
    b'{"x":[[1,{"a":"]"}],{}],"tokens":[3]}',
    b'{"x":{"tokens":[5]}}',
    b'{"tok\\u0065ns":[1]}',
    b'{"tokens":[1],"tokens":[2]}',
    b'{"tokens":[1],"tokens":null}',
    b'{"tokens":null}',
    b'{"tokens":[1.0]}',
    b'{"tokens":[01]}',
    b'{"tokens":[-1]}',
    b'{"tokens":[4294967296]}',
    b'{"tokens":[1,]}',
    b'{"tokens":[1]',
    b'{"tokens":[1]}x',
    b'{"tokens":[1]}}',
    b'{"x":{]},"tokens":[1]}',
    b'{"x":,"tokens":[1]}',
    b'{"x":"unterminated,"tokens":[1]}',
    b'{"x":' + b"[" * 70 + b"]" * 70 + b',"tokens":[1]}',
    b'{"x":' + b"[" * 60 + b"]" * 60 + b',"tokens":[1]}',
    b"{}",
    b"[1]",
    b"",
    b'\xef\xbb\xbf{"tokens":[1]}',
    b'{"tokens":[1],"explain":true,"top_k":2}',
]


def _ids(packed: bytes) -> list[int]:
    return [int.from_bytes(packed[i : i + 4], "little") for i in range(0, len(packed), 4)]


def _loads(text: bytes) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return ValueError


def _check_meaning(body: bytes, found: tuple[int, int, bytes] | None) -> None:
    """What the splitter finds is what JSON says: the "tokens" value, and the rest (the body with
    an empty array there) valid exactly when the body is, holding the same other fields."""
    if found is None:
        return
    start, stop, packed = found
    assert _ids(packed) == json.loads(body[start:stop])
    obj, rest = _loads(body), _loads(body[:start] + b"[]" + body[stop:])
    if obj is ValueError:
        assert rest is ValueError
    else:
        assert isinstance(obj, dict) and obj["tokens"] == _ids(packed) and rest == {**obj, "tokens": []}


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_the_twin_finds_what_json_says(body: bytes) -> None:
    _check_meaning(body, split_json_tokens_py(body))


@compiled
@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_compiled_splitter_matches_its_twin(body: bytes) -> None:
    assert native.split_json_tokens(body) == split_json_tokens_py(body)


def test_what_it_refuses() -> None:
    for i in (7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 22, 23, 25, 26, 27, 28):
        assert split_json_tokens_py(BODIES[i]) is None, BODIES[i]
    for i in (0, 1, 2, 3, 4, 5, 6, 21, 24, 29):  # 21 is not JSON: the rest is not either, the decoder refuses it
        assert split_json_tokens_py(BODIES[i]) is not None, BODIES[i]
    at = BODIES[5].rindex(b"[6]")
    assert split_json_tokens_py(BODIES[5])[:2] == (at, at + 3)  # the top-level one, not the nested one


FIELD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**33),
    st.text(alphabet='ab"\\[]{},: tokens', max_size=8),
    st.lists(st.integers(0, 2**32 - 1), max_size=5),
    st.dictionaries(st.sampled_from(["tokens", "a"]), st.lists(st.integers(0, 9), max_size=3), max_size=2),
)


@compiled
@given(
    st.dictionaries(st.sampled_from(["tokens", "cache_salt", "x", "tokens ", "[", "y"]), FIELD, max_size=5),
    st.booleans(),
)
def test_generated_bodies(obj: dict, spaced: bool) -> None:
    body = json.dumps(obj, indent=1 if spaced else None).encode()
    found = native.split_json_tokens(body)
    assert found == split_json_tokens_py(body)
    _check_meaning(body, found)
    plain = isinstance(obj.get("tokens"), list) and all(type(t) is int and 0 <= t < 2**32 for t in obj["tokens"])
    assert (found is not None) == plain


@compiled
@given(st.binary(max_size=48) | st.text(alphabet='{}[]"0123456789,:\\ tokens', max_size=40).map(str.encode))
def test_any_text(body: bytes) -> None:
    found = native.split_json_tokens(body)
    assert found == split_json_tokens_py(body)
    if found is not None:
        _check_meaning(body, found)


@compiled
def test_refuses_non_buffers() -> None:
    with pytest.raises(ValueError):
        native.split_json_tokens('{"tokens":[1]}')


@compiled
@pytest.mark.slow
def test_a_long_body_lets_other_threads_run() -> None:
    """4M ids (16 MB): the scan runs without the GIL, so a Python thread keeps counting meanwhile
    (holding it, the counter would stand still for the whole call)."""
    rng = random.Random(1)
    ids = [rng.randrange(1000) for _ in range(4_000_000)]
    body = json.dumps({"cache_salt": "t", "tokens": ids}, separators=(",", ":")).encode()
    ticks, stop, started = [0], threading.Event(), threading.Event()

    def count() -> None:
        started.set()
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        started.wait(5)
        time.sleep(0.01)
        before = ticks[0]
        t0 = time.perf_counter()
        found = native.split_json_tokens(body)
        took = time.perf_counter() - t0
        during = ticks[0] - before
    finally:
        stop.set()
        t.join(5)
    assert found is not None and found[2] == pack_tokens(ids)
    assert during > 1000, (during, took)


@compiled
def test_decode_packed_reads_a_long_body_through_the_splitter() -> None:
    ids = list(range(100_000))
    got = decode_packed(json.dumps({"tokens": ids, "explain": True, "lora_name": "a"}).encode())
    assert got is not None
    head, packed = got
    assert (head.explain, head.lora_name, packed) == (True, "a", pack_tokens(ids))
    assert decode_packed(bytearray(json.dumps({"tokens": ids}).encode())) is not None  # the pool's buffer
